//! One look at one schedule: what is due, the fire claimed and enqueued
//! through `fire.lua`, and what the schedule's status and the user should
//! hear. The controller and local mode both look through here.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use workerpool_queue::connection::{Conn, describe};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::schedule::{Fired, fire, forget_fires};

use super::{Schedule, Step, names_on, owner};
use crate::crd::{ConcurrencyPolicy, ScheduleSpec, ScheduleStatus};

/// Something worth telling the user about a look: an Event in a cluster, a
/// note in local mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// A warning rather than a normal event.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// What happened. Skips and misses say it without the fire time, so
    /// that repeats of one cause are one Event series.
    pub message: String,
}

/// What one look at a schedule came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    /// The schedule's status after the look.
    pub status: ScheduleStatus,
    /// The fire to wait for next (remembered as `nextFireTime`).
    pub pending: Option<Timestamp>,
    /// The job enqueued, by id.
    pub enqueued: Option<String>,
    /// What to tell the user, if anything.
    pub report: Option<Report>,
}

/// Forgets, on each of the pool's `queues`, the claims of schedules of pool
/// `namespace/pool` that `specs` no longer has there (removed, or moved to
/// another queue): one added later under the same name starts afresh
/// instead of from the old one's latest fire. Returns how many were
/// forgotten.
pub async fn forget_removed(
    conn: &mut impl Conn,
    specs: &[ScheduleSpec],
    queues: &[String],
    namespace: &str,
    pool: &str,
) -> redis::RedisResult<usize> {
    let owner = owner(namespace, pool);
    let mut forgotten = 0;
    for queue in queues {
        let keep = names_on(specs, queues, queue);
        forgotten += forget_fires(conn, &QueueKeys::new(queue.clone()), &owner, &keep).await?;
    }
    Ok(forgotten)
}

/// Looks at `schedule` of pool `namespace/pool` at `now`, waiting for the
/// fire `pending`, and fires it on `conn` when it is due. `old` is the
/// schedule's status before. A failed enqueue keeps the fire pending, so
/// the next look tries again (within the deadline).
pub async fn look(
    conn: &mut impl Conn,
    schedule: &Schedule,
    namespace: &str,
    pool: &str,
    pending: Option<Timestamp>,
    old: Option<&ScheduleStatus>,
    now: Timestamp,
) -> Look {
    let mut status = old.cloned().unwrap_or_else(|| ScheduleStatus {
        name: schedule.name.clone(),
        ..ScheduleStatus::default()
    });
    status.name = schedule.name.clone();
    let step = schedule.step(pending, now);
    let (at, next, earlier_missed) = match step {
        Step::Wait { next } => return quiet(status, next),
        Step::Suspended => return quiet(status, None),
        Step::Missed { at, late, next } => {
            let deadline = schedule.deadline.unwrap_or_default().as_secs();
            status.last_skip_time = Some(Time(at));
            status.last_skip_reason = Some(format!(
                "missed by {}, more than startingDeadlineSeconds ({deadline})",
                shown(late)
            ));
            status.next_fire_time = next.map(Time);
            return Look {
                report: Some(Report {
                    warning: true,
                    reason: "ScheduleMissed",
                    message: format!(
                        "schedule {}: a fire was missed by more than startingDeadlineSeconds ({deadline}) and skipped",
                        schedule.name
                    ),
                }),
                status,
                pending: next,
                enqueued: None,
            };
        }
        Step::Fire {
            at,
            next,
            earlier_missed,
        } => (at, next, earlier_missed),
    };
    let job = schedule.payload(namespace, pool, at, now);
    let id = schedule.job_id(namespace, pool, at);
    let queue = QueueKeys::new(schedule.queue.clone());
    let identity = schedule.identity(namespace, pool);
    match fire(conn, &queue, &identity, at.as_millisecond(), &job).await {
        Ok(Fired::Enqueued) => {
            status.last_fire_time = Some(Time(at));
            status.next_fire_time = next.map(Time);
            let mut message = format!("schedule {}: enqueued job {id}", schedule.name);
            if earlier_missed {
                message.push_str("; earlier fires were missed, and only the latest runs");
            }
            Look {
                status,
                pending: next,
                enqueued: Some(id),
                report: Some(Report {
                    warning: false,
                    reason: "ScheduleFired",
                    message,
                }),
            }
        }
        Ok(Fired::Refused) => {
            let why = match schedule.policy {
                ConcurrencyPolicy::Forbid => {
                    "previous job still running (concurrencyPolicy Forbid)"
                }
                ConcurrencyPolicy::Allow => "a job with its unique_key is still in the queue",
            };
            status.last_skip_time = Some(Time(at));
            status.last_skip_reason = Some(why.to_string());
            status.next_fire_time = next.map(Time);
            Look {
                status,
                pending: next,
                enqueued: None,
                report: Some(Report {
                    warning: false,
                    reason: "ScheduleSkipped",
                    message: format!("schedule {}: skipped a fire: {why}", schedule.name),
                }),
            }
        }
        // Another operator, or this one before a restart, claimed it.
        Ok(Fired::AlreadyClaimed { .. }) => quiet(status, next),
        Err(e) => {
            status.next_fire_time = Some(Time(at));
            Look {
                status,
                pending: Some(at),
                enqueued: None,
                report: Some(Report {
                    warning: true,
                    reason: "ScheduleFailed",
                    message: format!(
                        "schedule {}: cannot enqueue a fire on queue {}: {}; trying again",
                        schedule.name,
                        schedule.queue,
                        describe(&e)
                    ),
                }),
            }
        }
    }
}

fn quiet(mut status: ScheduleStatus, next: Option<Timestamp>) -> Look {
    status.next_fire_time = next.map(Time);
    Look {
        status,
        pending: next,
        enqueued: None,
        report: None,
    }
}

/// A lateness in whole seconds, as humantime writes it (`7h 30m`).
fn shown(late: Duration) -> String {
    humantime::format_duration(Duration::from_secs(late.as_secs())).to_string()
}
