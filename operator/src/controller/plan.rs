//! What a reconcile does, decided without I/O from what it observed.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use workerpool_queue::memory::Memory;

use super::Error;
use super::fires::Fires;
use super::memory::PoolMemory;
use super::observe::{FAILING_FOR, Failing, Observed, Replicas};
use super::status::{status, status_write};
use crate::crd::{WorkerPool, WorkerPoolStatus};
use crate::deployment;
use crate::disruption::{self, PodChange};
use crate::scaling::Verdict;
use crate::workload;

/// What one reconcile does, decided without I/O from what it observed.
#[derive(Debug)]
pub(super) struct Plan {
    /// The Deployment to apply.
    pub(super) deployment: Deployment,
    /// Whether to send it: not while the one last applied holds unchanged.
    pub(super) send_deployment: bool,
    /// The hash of what is sent, remembered once the API server took it.
    pub(super) fingerprint: Option<u64>,
    /// Mark idle pods cheapest to delete before the apply (a scale-down).
    pub(super) mark_idle: bool,
    /// The pods whose disruption marks change, one patch each.
    pub(super) protection: Vec<PodChange>,
    /// What to do to the pool's PodDisruptionBudget.
    pub(super) budget: BudgetWrite,
    /// The replica change the apply makes (from, to), if any: the engine
    /// records it only once the API server has taken the Deployment.
    pub(super) scale: Option<(i32, i32)>,
    /// Why the pool has its size, for the log of a scale.
    pub(super) scale_note: String,
    /// The knee the engine holds the pool at, while it does.
    pub(super) saturation: Option<crate::scaling::Saturation>,
    /// Events to record: type, reason, note.
    pub(super) events: Vec<(EventType, String, String)>,
    /// The workload problem to remember as announced (None: forget it).
    pub(super) announced: Option<String>,
    /// The status.
    pub(super) status: WorkerPoolStatus,
    /// Whether to write it ([`status_write`]).
    pub(super) write_status: bool,
    /// When the engine decided ([`Clock::now`]): the time of the scale it
    /// records once applied.
    pub(super) decided_at: Duration,
    /// When to look again.
    pub(super) requeue: Duration,
}

/// What a reconcile does to the pool's PodDisruptionBudget.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum BudgetWrite {
    /// Nothing: it is as the spec asks (or there is none, and none was made).
    Keep,
    /// Apply it: missing, or not as the spec asks.
    Apply(Box<PodDisruptionBudget>),
    /// Delete the one of this name: the spec no longer asks for it.
    Delete(String),
}

/// The clocks a plan reads, read once by the reconcile.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    /// The operator's monotonic time ([`super::Context::now`]).
    pub(super) now: Duration,
    /// The wall clock, for the times the status shows.
    pub(super) wall: Timestamp,
}

/// A hash of what an apply sends; `None` when it does not serialize (it
/// is then applied on every look, and the apply reports why it fails).
fn fingerprint(deployment: &Deployment) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let text = serde_json::to_string(deployment).ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    Some(hasher.finish())
}

/// Whether `live` still has the labels, annotations and owners of
/// `sent`: edits of its metadata do not move its generation.
fn metadata_holds(sent: &Deployment, live: &Deployment) -> bool {
    let subset = |want: &Option<std::collections::BTreeMap<String, String>>,
                  have: &Option<std::collections::BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    let (want, have) = (&sent.metadata, &live.metadata);
    subset(&want.labels, &have.labels)
        && subset(&want.annotations, &have.annotations)
        && want.owner_references.iter().flatten().all(|owner| {
            have.owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == owner.uid && o.controller == owner.controller)
        })
}

/// Everything a reconcile does, decided from what it observed: pure.
pub(super) fn plan(
    pool: &WorkerPool,
    observed: &Observed,
    fires: &Fires,
    verdict: &Verdict,
    memory: &PoolMemory,
    clock: Clock,
) -> Result<Plan, Error> {
    let announced = memory.announced.as_deref();
    let Replicas { current, ready, .. } = observed.replicas;
    let desired = verdict.desired;
    let replicas = Replicas {
        desired,
        ..observed.replicas
    };
    // Pods the cluster refuses first, then handlers that cannot run (the
    // workers' heartbeats say so even when the ready count looks fine).
    // Objects of the pool's names that are someone else's come first: the
    // pool leaves them alone, and cannot run until they are gone.
    let wanted = disruption::budget(pool);
    let foreign_budget = match (&wanted, &observed.budget) {
        (Some(_), Some(Some(live))) => {
            workload::not_owned("PodDisruptionBudget", &live.metadata, pool)
        }
        _ => None,
    };
    let foreign = observed.foreign.as_ref();
    let problem = foreign
        .cloned()
        .or_else(|| foreign_budget.clone())
        .or_else(|| {
            if ready < current {
                workload::problem(
                    observed.existing.as_ref(),
                    observed.pods.as_deref().unwrap_or_default(),
                )
            } else {
                None
            }
            .or_else(|| workload::handler_problem(observed.reading.as_ref().ok()?))
        });
    let deployment = deployment::build(pool, desired).map_err(Error::InvalidSpec)?;
    let mut events = Vec::new();
    let scale = (desired != current && foreign.is_none()).then_some((current, desired));
    if scale.is_some() && observed.existing.is_some() {
        let (reason, verb) = if desired > current {
            ("ScaledUp", "up")
        } else {
            ("ScaledDown", "down")
        };
        let note = format!(
            "scaled {verb} from {current} to {desired}: {}",
            verdict.message()
        );
        events.push((EventType::Normal, reason.to_string(), note));
    }
    if let Err(problem) = &observed.reading {
        events.push((
            EventType::Warning,
            problem.reason.to_string(),
            problem.message.clone(),
        ));
    }
    // An evicting Redis: once when it is first seen (or its policy
    // changes), and whenever it has evicted keys since the last look.
    if let Some((memory, evicted)) = &observed.memory {
        let said = condition_of(pool, "QueueSafe")
            .is_some_and(|c| c.status == "False" && c.reason == memory.reason());
        if let Some(warning) = memory.warning()
            && !said
        {
            events.push((EventType::Warning, memory.reason().to_string(), warning));
        }
        if *evicted > 0 {
            events.push((
                EventType::Warning,
                "KeysEvicted".to_string(),
                evicted_note(memory, *evicted),
            ));
        }
    }
    // One event when the workers start failing for a reason, not one per
    // poll: the status may lag a reconcile behind, the memory does not.
    if let Some(p) = &problem
        && ready_reason(pool) != Some(p.reason.as_str())
        && announced != Some(p.reason.as_str())
    {
        events.push((EventType::Warning, p.reason.clone(), p.message.clone()));
    }
    // One event as a pool reaches its knee and one as it leaves it.
    let was_saturated =
        condition_of(pool, super::status::SATURATED).is_some_and(|c| c.status == "True");
    match verdict.decision.as_ref().and_then(|d| d.saturation.as_ref()) {
        Some(s) if !was_saturated => events.push((
            EventType::Warning,
            super::status::SATURATED.to_string(),
            format!(
                "{}: held at the knee instead of adding workers that would only spread the waiting",
                s.message()
            ),
        )),
        None if was_saturated && verdict.decision.is_some() => events.push((
            EventType::Normal,
            "SaturationEnded".to_string(),
            "no knee holds the pool any more: its completions rise with its size again, or its load needs fewer workers".to_string(),
        )),
        _ => {}
    }
    if let Some(f) = &observed.failing
        && condition_of(pool, "JobsFailing").is_none_or(|c| c.status != "True")
    {
        events.push((
            EventType::Warning,
            "JobsFailing".to_string(),
            failing_note(f),
        ));
    }
    let mut status = status(
        pool,
        replicas,
        observed,
        verdict,
        problem.as_ref(),
        clock.wall,
    );
    // Busy pods' marks: decided on the workers' activity; with protection
    // off, the marks left are removed whether or not the queue can be read.
    let protect_on = pool
        .spec
        .disruption
        .as_ref()
        .is_some_and(|d| d.protect_busy_pods);
    let activity = match &observed.reading {
        Ok(snap) => Some(snap.activity_by_worker_id()),
        Err(_) if !protect_on => Some(Default::default()),
        Err(_) => None,
    };
    let protection = match (&observed.pods, activity) {
        (Some(pods), Some(activity)) if disruption::needs_pods(pool) => {
            Some(disruption::protection(
                pool.spec.disruption.as_ref(),
                pool.spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.as_ref()),
                pods,
                &activity,
                clock.wall,
            ))
        }
        _ => None,
    };
    status.protected_pods = match &protection {
        Some(p) => (protect_on || p.protected > 0).then_some(p.protected),
        None if !disruption::needs_pods(pool) => None,
        None => status.protected_pods,
    };
    let wanted_name = wanted
        .as_ref()
        .filter(|_| foreign_budget.is_none())
        .and_then(|b| b.metadata.name.clone());
    let previous = pool
        .status
        .as_ref()
        .and_then(|s| s.disruption_budget.clone());
    let budget = match (wanted, &observed.budget, previous) {
        (Some(_), _, _) if foreign_budget.is_some() => BudgetWrite::Keep,
        (Some(wanted), Some(Some(live)), _) if disruption::budget_holds(&wanted, live) => {
            BudgetWrite::Keep
        }
        (Some(wanted), _, _) => BudgetWrite::Apply(Box::new(wanted)),
        // Only the pool's own: a budget someone else made under the name stays.
        (None, Some(Some(live)), Some(name)) if disruption::owned_by(live, pool) => {
            BudgetWrite::Delete(name)
        }
        (None, _, _) => BudgetWrite::Keep,
    };
    status.disruption_budget = wanted_name;
    let poll = pool
        .spec
        .scaling
        .as_ref()
        .map_or(30, |s| s.poll_interval_seconds.max(1));
    let requeue = fires.fold(
        pool,
        &mut status,
        &mut events,
        Duration::from_secs(poll as u64),
    );
    // Applied before and unchanged since (its generation moves with any
    // edit of its spec, ours or anyone else's; an edit of its metadata
    // shows in the labels, annotations and owner it must have): applying
    // it again would change nothing, and with thousands of pools every
    // write counts for the API server.
    let sent = fingerprint(&deployment);
    let unchanged = sent.is_some_and(|sent| {
        observed.existing.as_ref().is_some_and(|live| {
            memory.applied == Some((sent, live.metadata.generation))
                && metadata_holds(&deployment, live)
        })
    });
    let write_status = status_write(
        pool.status.as_ref(),
        &status,
        memory.status_written,
        clock.now,
    );
    if scale.is_none() {
        status.last_scale_time = pool.status.as_ref().and_then(|s| s.last_scale_time.clone());
    }
    Ok(Plan {
        deployment,
        send_deployment: !unchanged && foreign.is_none(),
        fingerprint: sent,
        write_status,
        decided_at: clock.now,
        mark_idle: observed.reading.is_ok() && desired < current && foreign.is_none(),
        protection: protection.map(|p| p.changes).unwrap_or_default(),
        budget,
        scale,
        scale_note: verdict.message(),
        saturation: verdict.decision.as_ref().and_then(|d| d.saturation),
        events,
        announced: problem.map(|p| p.reason),
        status,
        requeue,
    })
}

/// The pool's condition `type_` as last written.
pub(super) fn condition_of<'a>(pool: &'a WorkerPool, type_: &str) -> Option<&'a Condition> {
    pool.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// What the `JobsFailing` condition and event say.
pub(super) fn failing_note(f: &Failing) -> String {
    let latest = if f.latest.is_empty() {
        String::new()
    } else {
        format!("; the newest: {}", f.latest)
    };
    format!(
        "{} job{} dead-lettered in the last {} minutes{latest}; see them with `workerpool dead list`",
        f.count,
        if f.count == 1 { "" } else { "s" },
        FAILING_FOR.as_secs() / 60
    )
}

/// The note of a `KeysEvicted` event.
pub(super) fn evicted_note(memory: &Memory, evicted: u64) -> String {
    let policy = memory.policy.as_deref().unwrap_or("unknown");
    let what = match memory.risk() {
        workerpool_queue::memory::Risk::Volatile => {
            "only keys with a TTL can go (a worker's details, a rate bucket)"
        }
        _ => "jobs of this pool's queues may be among them",
    };
    format!(
        "Redis evicted {evicted} keys since the last look (maxmemory-policy {policy}): {what}; \
         set maxmemory-policy noeviction, or give Redis more memory"
    )
}

/// The reason of the pool's `Ready` condition as last written.
pub(super) fn ready_reason(pool: &WorkerPool) -> Option<&str> {
    pool.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str())
}
