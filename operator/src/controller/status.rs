//! The pool's status: its figures and conditions, when it is written, and
//! the patch that writes it.

use std::time::Duration;

use super::observe::{FAILING_FOR, Observed, Replicas};
use super::plan::failing_note;
use crate::crd::{WorkerPool, WorkerPoolStatus};
use crate::deployment;
use crate::scaling::Verdict;
use crate::workload;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// How often a status that differs from the one written only in its rates
/// (`arrivalRate`, `throughput`) is written: after a burst the smoothed
/// rates decay for minutes, and a write on every look at every pool would
/// load the API server for figures that move on anyway.
pub(super) const RATES_WRITTEN_EVERY: Duration = Duration::from_secs(30);

/// Whether to write the status `new` over `old`, the status this operator
/// last wrote at `written` (`None`: not since it started), at `now`. An
/// unchanged status is not written again: for an idle pool that is every
/// look but the first. A change of its rates alone waits for
/// [`RATES_WRITTEN_EVERY`]; any other change is written at once.
pub(super) fn status_write(
    old: Option<&WorkerPoolStatus>,
    new: &WorkerPoolStatus,
    written: Option<Duration>,
    now: Duration,
) -> bool {
    let Some(old) = old else {
        return true;
    };
    if old == new {
        return false;
    }
    let rates_only = *new
        == WorkerPoolStatus {
            arrival_rate: new.arrival_rate,
            throughput: new.throughput,
            ..old.clone()
        };
    !rates_only || written.is_none_or(|at| now.saturating_sub(at) >= RATES_WRITTEN_EVERY)
}

/// The merge patch that makes the status `new` where it was `old`. A
/// field that `new` leaves out (an optional one that is `None`) is sent as
/// `null`, which removes it: left out of a merge patch, the old value would
/// stay (an oldest job's age shown after the queue drained).
pub(super) fn status_patch(
    old: Option<&WorkerPoolStatus>,
    new: &WorkerPoolStatus,
) -> serde_json::Value {
    let mut fields = match serde_json::to_value(new) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    if let Some(serde_json::Value::Object(old)) = old.and_then(|o| serde_json::to_value(o).ok()) {
        for name in old.keys() {
            fields
                .entry(name.clone())
                .or_insert(serde_json::Value::Null);
        }
    }
    json!({ "status": fields })
}

/// A rate as the status shows it: three significant digits, and none below
/// one job in a thousand seconds. The smoothed rates decay towards zero
/// without reaching it; shown in full they would change the status, and so
/// cost a write, on every look at a pool long idle.
pub(super) fn shown_rate(rate: f64) -> f64 {
    if !rate.is_finite() || rate.abs() < 0.001 {
        return 0.0;
    }
    let scale = 10f64.powi(2 - rate.abs().log10().floor() as i32);
    (rate * scale).round() / scale
}

/// The status of `pool` after what was `observed`, with the worker
/// `replicas`, the engine's `verdict` and the workload's `problem`, at `now`.
pub(super) fn status(
    pool: &WorkerPool,
    replicas: Replicas,
    observed: &Observed,
    verdict: &Verdict,
    problem: Option<&workload::Problem>,
    now: Timestamp,
) -> WorkerPoolStatus {
    let reading = &observed.reading;
    let memory = observed.memory.as_ref().map(|(m, _)| m);
    let failing = observed.failing.as_ref();
    let Replicas {
        desired,
        replicas,
        ready,
        current,
    } = replicas;
    let old = pool.status.clone().unwrap_or_default();
    let generation = pool.meta().generation;
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let previous = old.conditions.iter().find(|c| c.type_ == type_);
        let since = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Time(now),
        };
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: since,
            observed_generation: generation,
        }
    };
    let mut conditions = Vec::new();
    let (backlog, in_flight, oldest) = match reading {
        Ok(s) => {
            conditions.push(condition(
                "QueueReachable",
                true,
                "QueueRead",
                format!("read {} queue(s)", s.queues.len()),
            ));
            let c = s.counts();
            (
                c.backlog() as i64,
                c.held() as i64,
                c.oldest_job_age_seconds(),
            )
        }
        Err(p) => {
            conditions.push(condition(
                "QueueReachable",
                false,
                p.reason,
                p.message.clone(),
            ));
            (old.backlog, old.in_flight, old.oldest_job_age_seconds)
        }
    };
    // Whether Redis may delete the queue's keys to make room; kept as last
    // read while it cannot be read.
    match memory {
        Some(m) => conditions.push(condition(
            "QueueSafe",
            m.warning().is_none(),
            m.reason(),
            m.warning().unwrap_or_else(|| {
                "Redis does not evict keys (maxmemory-policy noeviction)".into()
            }),
        )),
        None => conditions.extend(
            old.conditions
                .iter()
                .find(|c| c.type_ == "QueueSafe")
                .cloned(),
        ),
    }
    // Dead letters lately: kept as last read while the queue cannot be read.
    match (reading, failing) {
        (Ok(_), Some(f)) => conditions.push(condition(
            "JobsFailing",
            true,
            "DeadLettered",
            failing_note(f),
        )),
        (Ok(_), None) => conditions.push(condition(
            "JobsFailing",
            false,
            "NoDeadLetters",
            format!(
                "no job dead-lettered in the last {} minutes",
                FAILING_FOR.as_secs() / 60
            ),
        )),
        (Err(_), _) => conditions.extend(
            old.conditions
                .iter()
                .find(|c| c.type_ == "JobsFailing")
                .cloned(),
        ),
    }
    let decision = verdict.decision.as_ref();
    match decision {
        Some(d) => {
            conditions.push(condition(
                "ScalingActive",
                reading.is_ok(),
                d.reason.rule.code(),
                d.reason.message(),
            ));
            conditions.push(condition(
                "ScalingLimited",
                d.reason.limit.is_some(),
                d.reason.limit.map_or("WithinLimits", |l| l.code()),
                d.reason.message(),
            ));
            conditions.push(saturated(d, &condition));
        }
        None => conditions.push(condition(
            "ScalingActive",
            false,
            verdict.code(),
            verdict.message(),
        )),
    }
    // Ready, which the Status column shows, names the most important
    // problem first: objects of the pool's names it may not write, then a
    // queue that cannot be read (the pool can neither run nor size its
    // workers), then workers the cluster refuses, and only then how many
    // are ready.
    let ready_ok = ready >= desired;
    let counted = format!("{ready} of {desired} workers ready");
    conditions.push(match (reading, problem) {
        (_, Some(p)) if workload::blocks_pool(&p.reason) => condition(
            "Ready",
            false,
            &p.reason,
            format!("{counted}: {}", p.message),
        ),
        (Err(q), _) => condition(
            "Ready",
            false,
            q.reason,
            format!("{counted}; {}", q.message),
        ),
        (Ok(_), Some(p)) if !ready_ok || p.reason == workload::HANDLER_FAILING => condition(
            "Ready",
            false,
            &p.reason,
            format!("{counted}: {}", p.message),
        ),
        (Ok(_), _) if failing.is_some() => condition(
            "Ready",
            false,
            "JobsFailing",
            format!(
                "{counted}; {}",
                failing.map(failing_note).unwrap_or_default()
            ),
        ),
        _ if ready_ok => condition("Ready", true, "WorkersReady", counted),
        _ => condition("Ready", false, "WorkersStarting", counted),
    });
    WorkerPoolStatus {
        replicas,
        ready_replicas: ready,
        desired_replicas: desired,
        reason: decision.map(|d| d.reason.code().to_string()),
        backlog,
        in_flight,
        oldest_job_age_seconds: oldest,
        arrival_rate: decision.and_then(|d| d.arrival_rate).map(shown_rate),
        throughput: decision.and_then(|d| {
            d.per_replica_throughput
                .map(|t| shown_rate(t * f64::from(ready.max(1))))
        }),
        pod_startup_seconds: decision
            .and_then(|d| d.pod_startup_seconds)
            .map(|s| (s * 10.0).round() / 10.0)
            .or(old.pod_startup_seconds),
        last_scale_time: if desired != current {
            Some(Time(now))
        } else {
            old.last_scale_time
        },
        selector: deployment::selector(&pool.name_any()),
        observed_generation: generation,
        conditions,
        schedules: old.schedules,
        protected_pods: old.protected_pods,
        disruption_budget: old.disruption_budget,
    }
}

/// `status` with its `Ready` condition saying that the API server refused
/// the pool's Deployment with `message`, at `now`: the replicas it asked
/// for were not applied, so no scale happened either.
pub(super) fn refused(
    pool: &WorkerPool,
    mut status: WorkerPoolStatus,
    message: &str,
    now: Timestamp,
) -> WorkerPoolStatus {
    let old = pool.status.as_ref();
    let was_false = old
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False");
    let counted = format!(
        "{} of {} workers ready",
        status.ready_replicas, status.desired_replicas
    );
    let ready = Condition {
        type_: "Ready".into(),
        status: "False".into(),
        reason: workload::DEPLOYMENT_REFUSED.into(),
        message: format!("{counted}: {message}"),
        last_transition_time: was_false.map_or(Time(now), |c| c.last_transition_time.clone()),
        observed_generation: pool.meta().generation,
    };
    status.conditions.retain(|c| c.type_ != "Ready");
    status.conditions.push(ready);
    status.last_scale_time = old.and_then(|s| s.last_scale_time.clone());
    status
}

/// Logs each problem the conditions show once as it starts and once as it
/// clears, not on every look.
pub(super) fn log_transitions(pool: &str, old: Option<&WorkerPoolStatus>, new: &WorkerPoolStatus) {
    for (type_, started) in transitions(old, new) {
        let Some(c) = new.conditions.iter().find(|c| c.type_ == type_) else {
            continue;
        };
        if started {
            tracing::warn!(pool, condition = %c.type_, reason = %c.reason, "{}", c.message);
        } else {
            tracing::info!(pool, condition = %c.type_, reason = %c.reason, "cleared: {}", c.message);
        }
    }
}

/// The conditions whose problem started (`true`) or cleared (`false`)
/// between `old` and `new`: the conditions are the memory of what was
/// said. `Ready` waiting for workers to start is no problem.
pub(super) fn transitions(
    old: Option<&WorkerPoolStatus>,
    new: &WorkerPoolStatus,
) -> Vec<(String, bool)> {
    const WATCHED: [&str; 5] = [
        "QueueReachable",
        "QueueSafe",
        "JobsFailing",
        "Ready",
        "SchedulesValid",
    ];
    // JobsFailing says its problem with True; the others with False.
    let problem = |c: &Condition| {
        if c.type_ == "JobsFailing" {
            c.status == "True"
        } else {
            c.status == "False" && c.reason != "WorkersStarting"
        }
    };
    let mut changes = Vec::new();
    for c in new
        .conditions
        .iter()
        .filter(|c| WATCHED.contains(&c.type_.as_str()))
    {
        let before = old.and_then(|o| o.conditions.iter().find(|o| o.type_ == c.type_));
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        if problem(c) {
            changes.push((c.type_.clone(), true));
        } else if before.is_some_and(problem) {
            changes.push((c.type_.clone(), false));
        }
    }
    changes
}

/// The `Saturated` condition: whether the engine measured a knee (more pods
/// stopped raising the pool's completions) and holds the pool at it.
fn saturated(
    d: &crate::scaling::Decision,
    condition: &impl Fn(&str, bool, &str, String) -> Condition,
) -> Condition {
    match &d.saturation {
        Some(s) if s.climbing => condition(SATURATED, true, "AtKnee", s.message()),
        Some(s) => condition(
            SATURATED,
            true,
            "AtKnee",
            format!(
                "{}; more workers would only spread the waiting",
                s.message()
            ),
        ),
        None => condition(
            SATURATED,
            false,
            "NoKnee",
            "completions rise with the pool's size (no knee measured)".to_string(),
        ),
    }
}

/// The condition that says a pool is held at its knee.
pub(super) const SATURATED: &str = "Saturated";
