//! Node disruption, decided without I/O: which pods to mark as not to be
//! disrupted while their workers hold long jobs, and the pool's
//! PodDisruptionBudget.
//!
//! Node autoscalers read two annotations on a pod: Karpenter does not
//! consolidate or expire a node with a `karpenter.sh/do-not-disrupt: "true"`
//! pod, and cluster-autoscaler does not scale down a node with a
//! `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` one. Written
//! into the pod template, they would hold every node with a worker forever,
//! idle workers included. The operator knows from the queue which worker
//! holds a job and for how long, so it sets them only while a worker holds
//! a job that has run `protectAfterSeconds`, and removes them once the
//! worker has held none for as long.
//!
//! The hysteresis bounds the writes: a pod's marks go on after a job has
//! run `protectAfterSeconds` and come off after `protectAfterSeconds`
//! without one, so each pod gets at most two patches per
//! `2 × protectAfterSeconds` (about one a minute with the default 60 s), and
//! a pod whose jobs are shorter than that gets none.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use workerpool_queue::snapshot::WorkerActivity;

use crate::crd::{DisruptionSpec, WorkerPool};
use crate::deployment::{self, POOL_LABEL};

/// Karpenter's annotation: it does not voluntarily disrupt the pod's node.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// cluster-autoscaler's annotation: `"false"` keeps the pod's node.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The operator's own mark, beside the two: when it protected the pod. Only
/// the marks of a pod that has it are ever removed, so marks a user wrote
/// (in the pool's template, or by hand) stay.
pub const PROTECTED_SINCE: &str = "workerpool.dev/protected-since";

/// What to do to one pod's marks.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Its worker has held a job for `protectAfterSeconds`: mark it.
    Protect,
    /// Its worker has held none for `protectAfterSeconds`, is gone, or
    /// protection is off: unmark it.
    Release,
}

/// One pod's change and the merge patch of its annotations that makes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodChange {
    /// The pod's name.
    pub pod: String,
    /// What changes.
    pub change: Change,
    /// The merge patch to send.
    pub patch: Value,
}

/// The protection decisions of one look.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Protection {
    /// The pods to patch, one patch each.
    pub changes: Vec<PodChange>,
    /// How many pods carry the operator's marks once the changes are made.
    pub protected: i32,
}

/// Whether the operator's marks are on `pod`.
pub fn is_protected(pod: &Pod) -> bool {
    pod.annotations().contains_key(PROTECTED_SINCE)
}

/// Decides each pod's marks from its worker's `activity` (by worker id,
/// the pod's name) at `now`. With protection off, every marked pod is
/// released. A pod being deleted is left as it is. A pod whose worker the
/// queue does not list (not started, or gone) counts as idle long enough.
pub fn protection(
    spec: Option<&DisruptionSpec>,
    template_annotations: Option<&BTreeMap<String, String>>,
    pods: &[Pod],
    activity: &BTreeMap<String, WorkerActivity>,
    now: Timestamp,
) -> Protection {
    let after_ms = spec
        .filter(|s| s.protect_busy_pods)
        .map(|s| u64::try_from(s.protect_after_seconds.max(0)).unwrap_or(0) * 1000);
    let mut out = Protection::default();
    for pod in pods {
        let marked = is_protected(pod);
        if pod.metadata.deletion_timestamp.is_some() {
            out.protected += i32::from(marked);
            continue;
        }
        let name = pod.name_any();
        let worker = activity.get(&name);
        let change = match after_ms {
            None => marked.then_some(Change::Release),
            Some(after) => {
                let busy_long = worker.and_then(|a| a.busy_ms).is_some_and(|ms| ms >= after);
                let idle_long = match worker {
                    None => true,
                    Some(a) if a.in_flight > 0 => false,
                    // A worker that does not say how long it has been idle
                    // (an older version) is as good as idle.
                    Some(a) => a.idle_ms.is_none_or(|ms| ms >= after),
                };
                if !marked && busy_long {
                    Some(Change::Protect)
                } else if marked && idle_long {
                    Some(Change::Release)
                } else {
                    None
                }
            }
        };
        let protected_after = match change {
            Some(Change::Protect) => true,
            Some(Change::Release) => false,
            None => marked,
        };
        out.protected += i32::from(protected_after);
        if let Some(change) = change {
            let patch = patch(&change, template_annotations, now);
            out.changes.push(PodChange {
                pod: name,
                change,
                patch,
            });
        }
    }
    out
}

/// The merge patch of a pod's annotations for `change`. A release removes
/// only what the pool's template does not set itself.
fn patch(change: &Change, template: Option<&BTreeMap<String, String>>, now: Timestamp) -> Value {
    let from_template = |key: &str| template.is_some_and(|t| t.contains_key(key));
    let mut annotations = serde_json::Map::new();
    match change {
        Change::Protect => {
            annotations.insert(PROTECTED_SINCE.into(), json!(now.to_string()));
            if !from_template(DO_NOT_DISRUPT) {
                annotations.insert(DO_NOT_DISRUPT.into(), json!("true"));
            }
            if !from_template(SAFE_TO_EVICT) {
                annotations.insert(SAFE_TO_EVICT.into(), json!("false"));
            }
        }
        Change::Release => {
            annotations.insert(PROTECTED_SINCE.into(), Value::Null);
            for key in [DO_NOT_DISRUPT, SAFE_TO_EVICT] {
                if !from_template(key) {
                    annotations.insert(key.into(), Value::Null);
                }
            }
        }
    }
    json!({"metadata": {"annotations": annotations}})
}

/// Whether a look must list the pool's pods for their marks: protection
/// is on, or the last status counted marked pods (protection turned off,
/// or the operator restarted, with marks left behind).
pub fn needs_pods(pool: &WorkerPool) -> bool {
    pool.spec
        .disruption
        .as_ref()
        .is_some_and(|d| d.protect_busy_pods)
        || pool
            .status
            .as_ref()
            .and_then(|s| s.protected_pods)
            .is_some_and(|n| n > 0)
}

/// The name of a pool's PodDisruptionBudget: the pool's own.
pub fn budget_name(pool: &WorkerPool) -> String {
    pool.name_any()
}

/// The PodDisruptionBudget `spec.disruption` asks for, owned by the pool
/// (removed with it); `None` when it asks for none. Pods that run but are
/// not ready may always be evicted (`unhealthyPodEvictionPolicy:
/// AlwaysAllow`): a crash-looping worker holds no job and must not hold a
/// drain.
pub fn budget(pool: &WorkerPool) -> Option<PodDisruptionBudget> {
    let d = pool.spec.disruption.as_ref()?;
    let (max_unavailable, min_available) = match (&d.max_unavailable, d.min_available) {
        (Some(max), _) => (Some(max.clone()), None),
        (None, Some(min)) => (None, Some(IntOrString::Int(min))),
        (None, None) => return None,
    };
    let name = budget_name(pool);
    Some(PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: pool.namespace(),
            labels: Some(deployment::labels(&name)),
            owner_references: pool.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable,
            min_available,
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(POOL_LABEL.to_string(), name)])),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
        }),
        status: None,
    })
}

/// Whether `live` is owned by `pool` (by its uid).
pub fn owned_by(live: &PodDisruptionBudget, pool: &WorkerPool) -> bool {
    let uid = pool.metadata.uid.as_deref();
    uid.is_some()
        && live
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(o.uid.as_str()) == uid)
}

/// Whether the live budget already says what `wanted` does.
pub fn budget_holds(wanted: &PodDisruptionBudget, live: &PodDisruptionBudget) -> bool {
    let (Some(w), Some(l)) = (&wanted.spec, &live.spec) else {
        return false;
    };
    w.max_unavailable == l.max_unavailable
        && w.min_available == l.min_available
        && w.selector == l.selector
        && w.unhealthy_pod_eviction_policy == l.unhealthy_pod_eviction_policy
        && live.metadata.owner_references.iter().flatten().any(|o| {
            wanted
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|w| w.uid == o.uid)
        })
}

#[cfg(test)]
mod tests;
