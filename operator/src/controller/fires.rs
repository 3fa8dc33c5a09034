//! The pool's schedules in a reconcile: each due fire claimed and enqueued
//! on the pool's Redis before the queue is read (so a pool at zero wakes in
//! the same reconcile), then folded into the status, the Events and the
//! requeue. Only the leader reconciles, and the claim in Redis keeps a fire
//! to one job across leader changes.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use workerpool_queue::connection::Endpoint;

use super::Context;
use crate::crd::{ScheduleStatus, WorkerPool, WorkerPoolStatus};
use crate::schedule::Schedule;
use crate::schedule::fire::{Report, forget_removed, look};

/// The condition that says whether every schedule can be used.
const CONDITION: &str = "SchedulesValid";

/// What the schedules came to in one reconcile.
#[derive(Debug, Default)]
pub(super) struct Fires {
    /// Each schedule's status, in spec order; `None` for a pool that has
    /// and had no schedules.
    statuses: Option<Vec<ScheduleStatus>>,
    /// What to tell the user.
    reports: Vec<Report>,
    /// What is wrong with the schedules that cannot be used.
    problems: Vec<String>,
    /// The earliest fire waited for that is still ahead.
    next: Option<Timestamp>,
    /// When the schedules were looked at.
    at: Timestamp,
}

/// Fires the pool's due schedules on the Redis at `endpoint`; `None`: the
/// pool's Redis could not be reached, and the schedules are kept as they
/// were, their fires still waited for.
pub(super) async fn fire(pool: &WorkerPool, ctx: &Context, endpoint: Option<&Endpoint>) -> Fires {
    let old = pool.status.as_ref().and_then(|s| s.schedules.clone());
    if pool.spec.schedules.is_empty() && old.is_none() {
        return Fires::default();
    }
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let queues = pool.spec.queue.redis.queue_names();
    let mut conn = match endpoint {
        Some(e) => ctx.redis_conn(e).await.ok(),
        None => None,
    };
    // The spec changed since the status was written (or the pool is new):
    // the claims of schedules it no longer has go.
    let observed = pool.status.as_ref().and_then(|s| s.observed_generation);
    if let Some(conn) = conn.as_mut()
        && (observed.is_none() || observed != pool.metadata.generation)
    {
        let specs = &pool.spec.schedules;
        match forget_removed(conn, specs, &queues, &namespace, &name).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(pool = %name, forgotten = n, "claims of removed schedules forgotten")
            }
            Err(e) => {
                tracing::warn!(pool = %name, error = %e, "could not forget the claims of removed schedules")
            }
        }
    }
    if pool.spec.schedules.is_empty() {
        return Fires {
            statuses: Some(Vec::new()),
            ..Fires::default()
        };
    }
    let old = old.unwrap_or_default();
    let previous = |n: &str| old.iter().find(|s| s.name == n);
    let now = Timestamp::now();
    let mut fires = Fires {
        statuses: Some(Vec::new()),
        at: now,
        ..Fires::default()
    };
    for (i, spec) in pool.spec.schedules.iter().enumerate() {
        let before = previous(&spec.name);
        let kept = || {
            before.cloned().unwrap_or_else(|| ScheduleStatus {
                name: spec.name.clone(),
                ..ScheduleStatus::default()
            })
        };
        let schedule = match Schedule::parse(spec, i, &queues) {
            Ok(s) => s,
            Err(problem) => {
                fires.problems.push(problem);
                let mut status = kept();
                status.next_fire_time = None;
                push(&mut fires, status);
                continue;
            }
        };
        let pending = before.and_then(|s| s.next_fire_time.as_ref()).map(|t| t.0);
        let Some(conn) = conn.as_mut() else {
            let status = kept();
            fires.next = earliest(fires.next, pending.filter(|p| *p > now));
            push(&mut fires, status);
            continue;
        };
        let seen = look(conn, &schedule, &namespace, &name, pending, before, now).await;
        fires.next = earliest(fires.next, seen.pending.filter(|p| *p > now));
        fires.reports.extend(seen.report);
        push(&mut fires, seen.status);
    }
    fires
}

fn push(fires: &mut Fires, status: ScheduleStatus) {
    if let Some(list) = fires.statuses.as_mut() {
        list.push(status);
    }
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Fires {
    /// Puts the schedules into the status (with the `SchedulesValid`
    /// condition for a pool that has any), their skips, misses, failures
    /// and problems into the events, and returns the requeue, shortened
    /// to wake for the next fire. A fire itself is in the status only.
    pub(super) fn fold(
        &self,
        pool: &WorkerPool,
        status: &mut WorkerPoolStatus,
        events: &mut Vec<(EventType, String, String)>,
        requeue: Duration,
    ) -> Duration {
        status.schedules.clone_from(&self.statuses);
        if pool.spec.schedules.is_empty() {
            return requeue;
        }
        let old = pool
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION));
        let (ok, reason, message) = if self.problems.is_empty() {
            (
                true,
                "SchedulesValid",
                format!("{} schedule(s) in use", pool.spec.schedules.len()),
            )
        } else {
            (false, "InvalidSchedule", self.problems.join("; "))
        };
        let state = if ok { "True" } else { "False" };
        if !ok && old.is_none_or(|c| c.status != state || c.message != message) {
            events.push((EventType::Warning, reason.into(), message.clone()));
        }
        status.conditions.push(Condition {
            type_: CONDITION.into(),
            status: state.into(),
            reason: reason.into(),
            message,
            last_transition_time: match old {
                Some(c) if c.status == state => c.last_transition_time.clone(),
                _ => Time(self.at),
            },
            observed_generation: pool.metadata.generation,
        });
        for report in self.reports.iter().filter(|r| r.reason != "ScheduleFired") {
            let type_ = if report.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            events.push((type_, report.reason.into(), report.message.clone()));
        }
        match self.next {
            // A little after the fire, so that the clock has reached it. A
            // fire already due that could not be enqueued (Redis) waits for
            // the next poll, which reads the queue again too.
            Some(next) if next > self.at => {
                let ms = (next.as_millisecond() - self.at.as_millisecond()) as u64;
                requeue.min(Duration::from_millis(ms + 50))
            }
            _ => requeue,
        }
    }
}
