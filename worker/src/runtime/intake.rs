//! Intake: fresh payloads are stamped, scheduled or dead-lettered in one
//! script, and a task starts for each job to run. Jobs come here from the
//! fetch loop and from the settle loop (jobs taken into freed slots).

use std::borrow::Cow;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use workerpool_queue::job::{self, DeadLetter, Intake, Job, SharedText, Stamp, intake};
use workerpool_queue::ops::{self, Fetched, IntakeAction, Payload, Start};

use super::Worker;
use super::ledger::InHand;

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
        let mut by_queue: Vec<Vec<(Payload, Stamp, Start)>> =
            self.queues.iter().map(|_| Vec::new()).collect();
        for Fetched {
            queue: i,
            payload,
            stamp,
            start,
        } in fetched
        {
            by_queue[i].push((payload, stamp, start));
        }
        for (qi, taken) in by_queue.into_iter().enumerate() {
            if taken.is_empty() {
                continue;
            }
            let q = &self.queues[qi];
            // Slots for as many as could run: the caller's first, then free ones.
            let mut mine = Vec::new();
            while mine.len() < taken.len() {
                match permits
                    .pop()
                    .or_else(|| self.slots.clone().try_acquire_owned().ok())
                {
                    Some(p) => mine.push(p),
                    None => break,
                }
            }
            let plan = plan(
                taken,
                mine.len(),
                now,
                self.config.max_attempts,
                &self.instance,
            );
            for letter in &plan.dead {
                self.log_dead(qi, letter);
            }
            let Plan {
                ready,
                mut actions,
                runs,
                back,
                ..
            } = plan;
            keep_in_intake(&mut actions, self.config.keep_outcomes);
            let mut mine = mine.into_iter();
            // Stamped as they were taken: they start now.
            for job in ready {
                let Some(permit) = mine.next() else { break };
                self.start_job(qi, job, permit);
            }
            let runs: Vec<_> = runs
                .into_iter()
                .map(|run| run.and_then(|job| mine.next().map(|p| (job, p))))
                .collect();
            // Slots no job here needed are the next queue's.
            permits.extend(mine);
            if !back.is_empty() {
                // Taken and never started: a kept one the taking script
                // wrote running is waiting again.
                let ids: Vec<Option<String>> =
                    back.iter().map(|(held, _)| job::id_in(held)).collect();
                let pairs: Vec<ops::Back<'_>> = back
                    .iter()
                    .zip(&ids)
                    .rev()
                    .map(|((held, original), id)| ops::Back {
                        held: held.as_slice(),
                        push: original.as_slice(),
                        kept: id.as_deref(),
                    })
                    .collect();
                let returned = self
                    .redis
                    .once("give_back", |mut c| async move {
                        ops::give_back(&mut c, q, &self.instance, &pairs, ops::NOT_STARTED).await
                    })
                    .await;
                if returned.is_err() {
                    self.suspect_lost_reply();
                }
            }
            if actions.is_empty() {
                continue;
            }
            let pending = &actions;
            let settled = self
                .redis
                .once("settle_intake", |mut c| async move {
                    ops::settle_intake(&mut c, q, &self.instance, pending).await
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
                    (
                        IntakeAction::Run { .. } | IntakeAction::RunNamed { .. },
                        Some((job, permit)),
                    ) if kept => {
                        self.start_job(qi, job, permit);
                    }
                    (IntakeAction::Schedule { .. }, _) if kept => {
                        self.metrics
                            .jobs
                            .with_label_values(&[q.name(), "scheduled"])
                            .inc();
                    }
                    (IntakeAction::Dead { .. }, _) if kept => self.job_metrics[qi].dead.inc(),
                    _ => {}
                }
            }
        }
    }

    /// Records a job in the ledger and starts its task.
    fn start_job(self: &Arc<Self>, qi: usize, ready: Ready, permit: OwnedSemaphorePermit) {
        let in_hand = InHand::start(qi, ready.job, ready.held);
        let entry = self.ledger().enter(in_hand.clone());
        self.tracker
            .spawn(self.clone().run_job(entry, in_hand, ready.start, permit));
    }
}

/// A job taken and planned to run, before it starts (then it is
/// [`InHand`]).
#[derive(Debug)]
struct Ready {
    /// The job.
    job: Arc<Job>,
    /// Its payload as the processing list holds it (once stamped).
    held: SharedText,
    /// What the taking script wrote of its outcome.
    start: Start,
}

/// What intake does with one queue's fresh payloads.
#[derive(Debug, Default)]
struct Plan {
    /// Jobs the taking script stamped as the worker reads them: they start
    /// without another round trip.
    ready: Vec<Ready>,
    /// One per payload that needs the intake script (runs after a stamp of
    /// the worker's, is scheduled or dead-lettered), in order.
    actions: Vec<IntakeAction>,
    /// Beside each action: the job to start when it runs.
    runs: Vec<Option<Ready>>,
    /// Jobs beyond the free slots, as held and as they were before any
    /// stamp: back to the head of the queue, their attempt not counted.
    back: Vec<(Payload, Payload)>,
    /// The dead letters among the actions.
    dead: Vec<DeadLetter>,
}

/// Notes, on the intake actions that schedule or dead-letter a job that
/// keeps its outcome (its own `keep`, else `default`, the worker's
/// `--keep-outcomes`), which outcome the script writes.
fn keep_in_intake(actions: &mut [IntakeAction], default: Option<std::time::Duration>) {
    fn kept_at(
        job: Option<&serde_json::Value>,
        default: Option<std::time::Duration>,
    ) -> Option<ops::KeptAt> {
        let fields = job?.as_object()?;
        let id = fields.get(job::field::ID)?.as_str()?;
        let keep = job::keep_of(fields).ok().flatten().or(default)?;
        Some(ops::KeptAt {
            id: id.to_string(),
            keep,
        })
    }
    for action in actions {
        match action {
            IntakeAction::Schedule { payload, kept, .. } => {
                let job = serde_json::from_slice::<serde_json::Value>(payload).ok();
                *kept = kept_at(job.as_ref(), default);
            }
            IntakeAction::Dead { envelope, kept, .. } => {
                let letter = serde_json::from_str::<serde_json::Value>(envelope).ok();
                *kept = kept_at(letter.as_ref().and_then(|l| l.get("job")), default);
            }
            IntakeAction::Run { .. } | IntakeAction::RunNamed { .. } => {}
        }
    }
}

/// Plans the intake of `taken` (as held, oldest first, with the taking
/// script's stamp) with `free` slots: pure, so the rules are tested
/// without Redis.
fn plan(
    taken: Vec<(Payload, Stamp, Start)>,
    free: usize,
    now_ms: u64,
    max_attempts: u32,
    instance: &str,
) -> Plan {
    let mut plan = Plan::default();
    let mut running = 0;
    for (held, stamp, start) in taken {
        let held = if running < free {
            // The job and the ledger keep the reply's bytes themselves
            // (no copy): a payload can be as large as the size limit.
            match job::take_stamped(held, stamp) {
                Ok((job, held)) => {
                    running += 1;
                    plan.ready.push(Ready {
                        job: Arc::new(job),
                        held,
                        start,
                    });
                    continue;
                }
                Err(held) => held,
            }
        } else if job::stamped(&held, stamp).is_some() {
            let original = job::unstamped(&held, stamp);
            plan.back.push((held, original));
            continue;
        } else {
            held
        };
        // A large payload the fetch script left untouched (its text stamp
        // reads no further than a few KiB) is stamped as text here too:
        // neither parsed into a `Value` nor sent back whole, twice.
        let held = if stamp == Stamp::Untouched && held.len() > ops::NAMED_ABOVE && running < free {
            match stamp_large(held, now_ms, max_attempts) {
                Ok((ready, action)) => {
                    running += 1;
                    plan.runs.push(Some(ready));
                    plan.actions.push(action);
                    continue;
                }
                Err(held) => held,
            }
        } else {
            held
        };
        // The worker's own intake, on the payload as it was pushed.
        let original: Cow<'_, [u8]> = match stamp {
            Stamp::Untouched => Cow::Borrowed(&held),
            _ => Cow::Owned(job::unstamped(&held, stamp)),
        };
        match intake(&original, now_ms, max_attempts, instance) {
            Intake::Run { job, stamped } => {
                if running < free {
                    running += 1;
                    plan.runs.push(Some(Ready {
                        job: Arc::new(job),
                        held: SharedText::from(stamped.as_str()),
                        start: Start::Unnoted,
                    }));
                    plan.actions.push(IntakeAction::Run { held, stamped });
                } else {
                    // More arrived at once than slots are free.
                    let original = original.into_owned();
                    plan.back.push((held, original));
                }
            }
            Intake::Schedule { run_at } => {
                let payload = original.into_owned();
                plan.runs.push(None);
                plan.actions.push(IntakeAction::Schedule {
                    held,
                    payload,
                    run_at,
                    kept: None,
                });
            }
            Intake::Dead(letter) => {
                plan.runs.push(None);
                plan.actions.push(IntakeAction::Dead {
                    held,
                    envelope: letter.to_json(),
                    release: letter.job.as_object().and_then(job::release_token),
                    kept: None,
                });
                plan.dead.push(letter);
            }
        }
    }
    plan
}

/// The text stamp of a large fresh payload ([`job::fresh_stamp`]): the job
/// to run, holding the stamped bytes, and the intake action that stamps
/// the held payload the same way in Redis; the payload back, as held, when
/// it needs the full intake.
fn stamp_large(
    held: Payload,
    now_ms: u64,
    max_attempts: u32,
) -> Result<(Ready, IntakeAction), Payload> {
    let Some(added) = job::fresh_stamp(&held, now_ms, max_attempts) else {
        return Err(held);
    };
    let name = ops::name_of(&held);
    // In the payload's own buffer, grown by the stamp's few bytes: the
    // reply's bytes become the job's text.
    let mut stamped = held;
    stamped.reserve_exact(added.len());
    stamped.splice(1..1, added.bytes());
    match job::take_stamped(stamped, Stamp::Fresh(added.len())) {
        Ok((job, text)) => Ok((
            Ready {
                job: Arc::new(job),
                held: text,
                start: Start::Unnoted,
            },
            IntakeAction::RunNamed { name, added },
        )),
        // `fresh_stamp` read it as a fresh job, so this does not happen;
        // should it, the full intake decides, on the bytes as held.
        Err(mut bytes) => {
            bytes.drain(1..1 + added.len());
            Err(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn raws(payloads: &[&[u8]]) -> Vec<(Payload, Stamp, Start)> {
        payloads
            .iter()
            .map(|p| (p.to_vec(), Stamp::Untouched, Start::Unnoted))
            .collect()
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
        assert!(matches!(&plan.actions[0], IntakeAction::Run { held, .. } if held == b"{\"n\":1}"));
        assert_eq!(
            plan.back,
            vec![(b"{\"n\":3}".to_vec(), b"{\"n\":3}".to_vec())]
        );
        assert_eq!(plan.runs.iter().flatten().count(), 2);
    }

    #[test]
    fn a_unique_job_out_of_attempts_frees_its_key_as_it_is_dead_lettered() {
        let plan = plan(
            raws(&[
                br#"{"attempt":5,"id":"j1","unique_key":"report:7"}"#,
                br#"{"attempt":5,"id":"j2"}"#,
            ]),
            2,
            NOW,
            5,
            "w~1",
        );
        let releases: Vec<Option<&str>> = plan
            .actions
            .iter()
            .map(|a| match a {
                IntakeAction::Dead { release, .. } => release.as_deref(),
                other => panic!("dead-lettered at intake: {other:?}"),
            })
            .collect();
        assert_eq!(releases, [Some("2:j1report:7"), None]);
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
        let both = (b"{}".to_vec(), b"{}".to_vec());
        assert_eq!(plan.back, vec![both.clone(), both]);
    }

    /// A payload as the fetch script stamps a fresh one.
    fn fresh(rest: &str) -> (Payload, Stamp, Start) {
        let add =
            r#""attempt":1,"id":"00112233445566778899aabbccddeeff","enqueued_at":1700000000000,"#;
        (
            format!("{{{add}{rest}").into_bytes(),
            Stamp::Fresh(add.len()),
            Start::Unnoted,
        )
    }

    #[test]
    fn jobs_the_fetch_script_stamped_start_without_the_intake_script() {
        let counted = br#"{"attempt":3,"id":"a","enqueued_at":1,"task":"t"}"#.to_vec();
        let plan = plan(
            vec![
                fresh(r#""task":"t"}"#),
                (counted.clone(), Stamp::Counted, Start::Unnoted),
            ],
            2,
            NOW,
            5,
            "w~1",
        );
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
        assert_eq!(plan.ready.len(), 2);
        assert_eq!(plan.ready[0].job.attempt(), 1);
        assert_eq!(plan.ready[0].job.id(), "00112233445566778899aabbccddeeff");
        assert_eq!(plan.ready[1].job.attempt(), 3);
        assert_eq!(
            &*plan.ready[1].held,
            std::str::from_utf8(&counted).expect("UTF-8")
        );
    }

    #[test]
    fn a_job_the_script_took_for_having_an_id_it_has_only_nested_gets_one_from_the_worker() {
        // Should the script take an `id` that sits in a nested object just
        // before `enqueued_at` for the object's own, it adds only the attempt.
        let pushed = br#"{"data":{"id":7},"task":"t","enqueued_at":5}"#;
        let held = br#"{"attempt":1,"data":{"id":7},"task":"t","enqueued_at":5}"#.to_vec();
        let stamp = Stamp::Fresh(12);
        assert_eq!(job::unstamped(&held, stamp), pushed.to_vec());
        let plan = plan(
            vec![(held.clone(), stamp, Start::Unnoted)],
            1,
            NOW,
            5,
            "w~1",
        );
        assert!(
            plan.ready.is_empty(),
            "no top-level id: the stamp does not stand"
        );
        let IntakeAction::Run { held: h, stamped } = &plan.actions[0] else {
            panic!("{:?}", plan.actions[0]);
        };
        assert_eq!(*h, held);
        let job = &plan.runs[0].as_ref().expect("runs").job;
        assert_eq!(job.attempt(), 1);
        assert_eq!(job.id().len(), 32, "a fresh id: {stamped}");
        assert_eq!(job.data()["id"], 7);
    }

    #[test]
    fn a_large_fresh_payload_is_stamped_as_text_and_named_to_the_script() {
        let data = "x".repeat(ops::NAMED_ABOVE);
        let pushed = format!(r#"{{"task":"big","data":"{data}","n":1.10,"id":"a"}}"#);
        let plan = plan(raws(&[pushed.as_bytes()]), 1, NOW, 5, "w~1");
        let [IntakeAction::RunNamed { name, added }] = plan.actions.as_slice() else {
            panic!("{:?}", plan.actions);
        };
        assert_eq!(*name, ops::name_of(pushed.as_bytes()));
        assert_eq!(added, &format!(r#""attempt":1,"enqueued_at":{NOW},"#));
        let ready = plan.runs[0].as_ref().expect("runs");
        assert_eq!(&*ready.held, format!("{{{added}{}", &pushed[1..]));
        assert_eq!((ready.job.id(), ready.job.attempt()), ("a", 1));
        assert_eq!(ready.job.data(), &serde_json::Value::from(data));
        // Not fresh, or beyond the free slots: as before.
        let counted = format!(
            r#"{{"attempt":2,"data":"{}"}}"#,
            "x".repeat(ops::NAMED_ABOVE)
        );
        let plan_counted = plan_of(&counted, 1);
        assert!(
            matches!(&plan_counted.actions[0], IntakeAction::Run { stamped, .. } if stamped.starts_with(r#"{"attempt":3,"#))
        );
        assert_eq!(plan_of(&pushed, 0).back.len(), 1);
    }

    fn plan_of(payload: &str, free: usize) -> Plan {
        plan(raws(&[payload.as_bytes()]), free, NOW, 5, "w~1")
    }

    #[test]
    fn a_stamped_job_beyond_the_free_slots_goes_back_as_it_was_pushed() {
        let plan = plan(vec![fresh(r#""task":"t"}"#)], 0, NOW, 5, "w~1");
        assert!(plan.ready.is_empty());
        assert_eq!(plan.back.len(), 1);
        assert_eq!(plan.back[0].1, br#"{"task":"t"}"#.to_vec());
    }

    #[test]
    fn a_stamp_the_worker_does_not_agree_with_goes_through_intake_on_the_pushed_bytes() {
        // A wrong field type and bytes that are not UTF-8: dead-lettered,
        // the letter keeping the payload as pushed, the held one removed.
        let (held, stamp, _) = fresh(r#""task":5}"#);
        let (binary, binary_stamp, _) = fresh("\"data\":\"\u{0}\"}");
        let mut binary = binary;
        let at = binary.len() - 3;
        binary[at] = 0xff;
        // An escaped field name the text stamp cannot see: the worker stamps it.
        let (escaped, escaped_stamp, _) = fresh(r#""\u0061ttempt":2}"#);
        let plan = plan(
            vec![
                (held.clone(), stamp, Start::Unnoted),
                (binary.clone(), binary_stamp, Start::Unnoted),
                (escaped.clone(), escaped_stamp, Start::Unnoted),
            ],
            3,
            NOW,
            5,
            "w~1",
        );
        assert!(plan.ready.is_empty());
        assert!(
            matches!(&plan.actions[0], IntakeAction::Dead { held: h, envelope, .. } if *h == held && envelope.contains(r#""job":{"task":5}"#)),
            "{:?}",
            plan.actions[0]
        );
        let IntakeAction::Dead { held: h, .. } = &plan.actions[1] else {
            panic!("{:?}", plan.actions[1]);
        };
        assert_eq!(*h, binary);
        assert_eq!(
            plan.dead[1].raw_payload(),
            Some(job::unstamped(&binary, binary_stamp))
        );
        let IntakeAction::Run { held: h, stamped } = &plan.actions[2] else {
            panic!("{:?}", plan.actions[2]);
        };
        assert_eq!(*h, escaped);
        assert!(stamped.starts_with(r#"{"attempt":3,"#), "{stamped}");
        assert_eq!(plan.dead.len(), 2);
    }
}
