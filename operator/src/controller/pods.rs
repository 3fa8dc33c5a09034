//! The pool's pods: listed while workers are missing, and marked cheapest
//! to delete while idle before a scale-down.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use workerpool_queue::snapshot::Snapshot;

use super::Context;
use super::Error;
use crate::crd::WorkerPool;
use crate::deployment;

/// The annotation the ReplicaSet controller reads to pick pods to delete.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The pool's pods.
pub(super) async fn list_pods(pool: &WorkerPool, ctx: &Context) -> Result<Vec<Pod>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let list = pods
        .list(&ListParams::default().labels(&deployment::selector(&pool.name_any())))
        .await
        .map_err(Error::ListPods)?;
    Ok(list.items)
}

/// Before a scale-down, sets each pod's deletion cost to its live worker's
/// jobs in hand, so the ReplicaSet removes idle workers first (and pods
/// whose worker is lost: the reaper returns its jobs to the queue).
pub(super) async fn mark_idle_pods(
    pool: &WorkerPool,
    ctx: &Context,
    snap: &Snapshot,
    list: Vec<Pod>,
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let activity = snap.activity_by_worker_id();
    for pod in list {
        let name = pod.name_any();
        let cost = activity.get(&name).map_or(0, |a| a.in_flight).to_string();
        if pod.annotations().get(DELETION_COST) == Some(&cost) {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {DELETION_COST: cost}}});
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::PatchPod)?;
    }
    Ok(())
}
