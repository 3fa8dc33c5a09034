//! Why a pool's workers are not running, read from its Deployment and pods.
//! Pure code: the controller passes in what it read.
//!
//! The reasons users meet most sit where `kubectl get wp` never looks: the
//! Deployment's `ReplicaFailure` condition (Pod Security, a quota, a missing
//! ServiceAccount: the ReplicaSet cannot create pods) and the pods' container
//! statuses (an image that cannot be pulled, a worker that keeps crashing).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::WorkerPool;

/// The longest message carried into a condition or event.
const MAX_MESSAGE: usize = 1024;

/// Container waiting reasons that will not go away by waiting.
const STUCK: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Why the workers are not running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// CamelCase reason for the `Ready` condition and the event: the
    /// Deployment's (`FailedCreate`) or the container's (`ImagePullBackOff`).
    pub reason: String,
    /// The API server's or the kubelet's message, with the object it is about.
    pub message: String,
}

/// The `Ready` reason of workers whose handler cannot run jobs.
pub const HANDLER_FAILING: &str = "HandlerFailing";

/// Workers whose handler cannot run jobs (it cannot start, or it dies
/// before it answers), as their heartbeats in `snap` say. Such a worker
/// reports not ready and gives its jobs back; the pods' logs, which say
/// more, are gone once the pool scales to zero.
pub fn handler_problem(snap: &workerpool_queue::snapshot::Snapshot) -> Option<Problem> {
    let problems = snap.handler_problems();
    let (pod, why) = problems.iter().next()?;
    let more = match problems.len() - 1 {
        0 => String::new(),
        n => format!(
            " ({n} more worker{} report the same or worse)",
            if n == 1 { "" } else { "s" }
        ),
    };
    Some(Problem {
        reason: HANDLER_FAILING.into(),
        message: format!(
            "worker {}: {}{more}",
            workerpool_queue::text::safe_line(pod, 80),
            workerpool_queue::text::safe_line(why, 400)
        ),
    })
}

/// The `Ready` reason of a Deployment of the pool's name that the pool
/// does not own: it is left alone, never applied over.
pub const DEPLOYMENT_NOT_OWNED: &str = "DeploymentNotOwned";

/// The `Ready` reason of a PodDisruptionBudget of the pool's name that the
/// pool does not own.
pub const BUDGET_NOT_OWNED: &str = "DisruptionBudgetNotOwned";

/// The `Ready` reason of a Deployment the API server refused to take (an
/// immutable field changed, a name too long for a label, a policy).
pub const DEPLOYMENT_REFUSED: &str = "DeploymentRefused";

/// Whether the problem `reason` is about the pool's own objects, which it
/// cannot write as its spec asks until the problem is fixed: shown first,
/// however many workers are ready and whether or not the queue is read.
pub fn blocks_pool(reason: &str) -> bool {
    [DEPLOYMENT_NOT_OWNED, BUDGET_NOT_OWNED, DEPLOYMENT_REFUSED].contains(&reason)
}

/// Whether the object of `meta` is `pool`'s: it names the pool's uid among
/// its owners. A pool not yet given a uid (never so on an API server) owns
/// nothing.
pub fn owned(meta: &ObjectMeta, pool: &WorkerPool) -> bool {
    let Some(uid) = pool.metadata.uid.as_deref() else {
        return false;
    };
    meta.owner_references.iter().flatten().any(|o| o.uid == uid)
}

/// The problem of an object of `kind` named as the pool's objects are but
/// made by someone else: a forced apply would take it over, and garbage
/// collection would then delete it with the pool.
pub fn not_owned(kind: &str, meta: &ObjectMeta, pool: &WorkerPool) -> Option<Problem> {
    if owned(meta, pool) {
        return None;
    }
    let name = meta.name.as_deref().unwrap_or("?");
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map_or_else(
            || "it has no controller".to_string(),
            |o| format!("its controller is {} {}", o.kind, o.name),
        );
    let (reason, what) = match kind {
        "Deployment" => (DEPLOYMENT_NOT_OWNED, "the pool runs no workers"),
        _ => (BUDGET_NOT_OWNED, "the pool does not write its budget"),
    };
    Some(Problem {
        reason: reason.into(),
        message: cut(&format!(
            "{kind} {name} exists and is not this pool's ({owner}); {what} until it is \
             deleted, or the pool is given another name"
        )),
    })
}

/// The first problem that keeps the pool's workers from running, if any.
pub fn problem(deployment: Option<&Deployment>, pods: &[Pod]) -> Option<Problem> {
    let conditions = deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.conditions.as_ref());
    if let Some(failure) = conditions
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
    {
        return Some(Problem {
            reason: failure
                .reason
                .clone()
                .unwrap_or_else(|| "ReplicaFailure".into()),
            message: cut(failure
                .message
                .as_deref()
                .unwrap_or("pods cannot be created")),
        });
    }
    for pod in pods {
        let name = pod.metadata.name.as_deref().unwrap_or("?");
        let Some(status) = pod.status.as_ref() else {
            continue;
        };
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for c in containers {
            if let Some(p) = stuck(name, c) {
                return Some(p);
            }
        }
        if let Some(unschedulable) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
        {
            return Some(Problem {
                reason: "Unschedulable".into(),
                message: cut(&format!(
                    "pod {name}: {}",
                    unschedulable
                        .message
                        .as_deref()
                        .unwrap_or("cannot be scheduled")
                )),
            });
        }
    }
    conditions
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        })
        .map(|c| Problem {
            reason: "ProgressDeadlineExceeded".into(),
            message: cut(c.message.as_deref().unwrap_or("the rollout is stuck")),
        })
}

fn stuck(pod: &str, c: &ContainerStatus) -> Option<Problem> {
    let waiting = c.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !STUCK.contains(&reason) {
        return None;
    }
    let mut message = format!("pod {pod}, container {}: {reason}", c.name);
    if let Some(m) = waiting.message.as_deref().filter(|m| !m.is_empty()) {
        message.push_str(": ");
        message.push_str(m);
    }
    if let Some(last) = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
        message.push_str(&format!("; last exit code {}", last.exit_code));
        if let Some(r) = &last.reason {
            message.push_str(&format!(" ({r})"));
        }
    }
    Some(Problem {
        reason: reason.into(),
        message: cut(&message),
    })
}

fn cut(message: &str) -> String {
    match message.char_indices().nth(MAX_MESSAGE) {
        Some((i, _)) => format!("{}…", &message[..i]),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(conditions: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "mail"},
            "status": {"conditions": conditions},
        }))
        .expect("deployment")
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "mail-abc"}, "status": status}))
            .expect("pod")
    }

    #[test]
    fn a_replica_failure_of_the_deployment_is_the_problem_with_the_api_servers_message() {
        let d = deployment(json!([
            {"type": "Available", "status": "False"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": "pods \"mail-x\" is forbidden: violates PodSecurity \"restricted:latest\": privileged"}
        ]));
        let p = problem(Some(&d), &[]).expect("a problem");
        assert_eq!(p.reason, "FailedCreate");
        assert!(p.message.contains("violates PodSecurity"), "{}", p.message);
    }

    #[test]
    fn pods_that_cannot_pull_or_keep_crashing_are_the_problem_with_the_kubelets_message() {
        let pull = pod(json!({"containerStatuses": [{
            "name": "worker", "image": "nope:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope:1\""}}
        }]}));
        let p = problem(None, &[pull]).expect("a problem");
        assert_eq!(p.reason, "ImagePullBackOff");
        assert_eq!(
            p.message,
            "pod mail-abc, container worker: ImagePullBackOff: Back-off pulling image \"nope:1\""
        );
        let crash = pod(json!({"containerStatuses": [{
            "name": "worker", "image": "w", "imageID": "", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}
        }]}));
        let p = problem(None, &[crash]).expect("a problem");
        assert_eq!(p.reason, "CrashLoopBackOff");
        assert!(
            p.message.ends_with("last exit code 2 (Error)"),
            "{}",
            p.message
        );
    }

    #[test]
    fn starting_pods_and_healthy_deployments_are_no_problem() {
        let starting = pod(json!({"containerStatuses": [{
            "name": "worker", "image": "w", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}
        }]}));
        let d = deployment(
            json!([{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]),
        );
        assert_eq!(problem(Some(&d), &[starting, pod(json!({}))]), None);
        assert_eq!(problem(None, &[]), None);
    }

    #[test]
    fn unschedulable_pods_and_stuck_rollouts_are_problems() {
        let pending = pod(
            json!({"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}]}),
        );
        let p = problem(None, &[pending]).expect("a problem");
        assert_eq!(p.reason, "Unschedulable");
        assert!(p.message.contains("Insufficient cpu"));
        let d = deployment(json!([{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"mail-1\" has timed out progressing."}]));
        assert_eq!(
            problem(Some(&d), &[]).map(|p| p.reason),
            Some("ProgressDeadlineExceeded".into())
        );
        let long = "x".repeat(5000);
        let d = deployment(json!([{"type": "ReplicaFailure", "status": "True", "message": long}]));
        let p = problem(Some(&d), &[]).expect("a problem");
        assert_eq!(p.reason, "ReplicaFailure");
        assert_eq!(p.message.chars().count(), MAX_MESSAGE + 1);
    }
}
