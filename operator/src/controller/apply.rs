//! Carries out a plan: deletion costs, the Deployment, events, status.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::observe::Observed;
use super::plan::Plan;
use super::pods::{list_pods, mark_idle_pods};
use super::status::{log_transitions, status_patch};
use super::{Context, Error, MANAGER, pool_key};
use crate::crd::WorkerPool;
use crate::events::{EventType, Note};
use crate::metrics::Replicas;

/// Carries out a plan: deletion costs, the Deployment, events, status.
pub(super) async fn apply(
    pool: &WorkerPool,
    ctx: &Context,
    observed: Observed,
    plan: Plan,
) -> Result<Action, Error> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    if let Some((memory, _)) = &observed.memory {
        ctx.metrics.observe_memory(&ns, &name, memory);
    }
    ctx.metrics.observe_pool(
        &ns,
        &name,
        observed.reading.as_ref().ok(),
        Replicas {
            desired: plan.status.desired_replicas,
            ready: plan.status.ready_replicas,
            max: pool
                .spec
                .scaling
                .as_ref()
                .map(|s| s.max_replicas.max(s.min_replicas)),
        },
    );
    if plan.mark_idle
        && let Ok(snap) = &observed.reading
    {
        let pods = match observed.pods {
            Some(p) => p,
            None => list_pods(pool, ctx).await?,
        };
        mark_idle_pods(pool, ctx, snap, pods).await?;
    }
    let key = pool_key(pool);
    if plan.send_deployment {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
        let live = deployments
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&plan.deployment),
            )
            .await
            .map_err(Error::ApplyDeployment)?;
        let applied = plan
            .fingerprint
            .map(|sent| (sent, live.metadata.generation));
        ctx.pool(&key, |m| m.applied = applied);
    }
    // The scale event counts for the rate policies only now that it was
    // applied: a refused apply changed nothing.
    if let Some((from, to)) = plan.scale {
        ctx.metrics.observe_scale(&ns, &name, from, to);
        tracing::info!(
            pool = %key,
            from,
            to,
            reason = plan.status.reason.as_deref().unwrap_or("Replicas"),
            "scaled: {}",
            plan.scale_note
        );
    }
    log_transitions(&key, pool.status.as_ref(), &plan.status);
    if let Some((from, to)) = plan.scale {
        ctx.pool(&key, |m| m.engine.applied(plan.decided_at, from, to));
    }
    let reference = pool.object_ref(&());
    for (type_, reason, note) in plan.events {
        publish(ctx, &reference, type_, &reason, note).await;
    }
    ctx.pool(&key, |m| m.announced = plan.announced);
    if plan.write_status {
        let pools: Api<WorkerPool> = Api::namespaced(ctx.client.clone(), &ns);
        pools
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(status_patch(pool.status.as_ref(), &plan.status)),
            )
            .await
            .map_err(Error::PatchStatus)?;
        let now = ctx.now();
        ctx.pool(&key, |m| m.status_written = Some(now));
    }
    tracing::debug!(
        pool = %key,
        backlog = plan.status.backlog,
        desired = plan.status.desired_replicas,
        reason = plan.status.reason.as_deref().unwrap_or_default(),
        requeue = ?plan.requeue,
        "reconciled"
    );
    Ok(Action::requeue(plan.requeue))
}

pub(super) async fn publish(
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Note {
        type_,
        reason: reason.into(),
        note,
    };
    if let Err(e) = ctx.recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, "cannot publish event");
    }
}
