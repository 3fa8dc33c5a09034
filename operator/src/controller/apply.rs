//! Carries out a plan: deletion costs, the Deployment, events, status.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::observe::Observed;
use super::plan::{Plan, fingerprint, metadata_holds};
use super::pods::{list_pods, mark_idle_pods};
use super::status::{log_transitions, status_patch, status_write};
use super::{Context, Error, MANAGER, lock, pool_key};
use crate::crd::WorkerPool;
use crate::events::{EventType, Note};
use crate::metrics::Replicas;

/// Carries out a plan: deletion costs, the Deployment, events, status.
pub(super) async fn apply(
    pool: &WorkerPool,
    ctx: &Context,
    observed: Observed,
    plan: Plan,
    decided_at: Duration,
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
    // Applied before and unchanged since (its generation moves with any
    // edit of its spec, ours or anyone else's; an edit of its metadata
    // shows in the labels, annotations and owner it must have): applying
    // it again would change nothing, and with thousands of pools every
    // write counts for the API server.
    let key = pool_key(pool);
    let sent = fingerprint(&plan.deployment);
    let unchanged = sent.is_some_and(|sent| {
        observed.existing.as_ref().is_some_and(|live| {
            lock(&ctx.applied).get(&key) == Some(&(sent, live.metadata.generation))
                && metadata_holds(&plan.deployment, live)
        })
    });
    if !unchanged {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
        let live = deployments
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&plan.deployment),
            )
            .await
            .map_err(Error::ApplyDeployment)?;
        match sent {
            Some(sent) => lock(&ctx.applied).insert(key.clone(), (sent, live.metadata.generation)),
            None => lock(&ctx.applied).remove(&key),
        };
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
    if let Some((from, to)) = plan.scale
        && let Some(engine) = lock(&ctx.engines).get_mut(&key)
    {
        engine.applied(decided_at, from, to);
    }
    let reference = pool.object_ref(&());
    for (type_, reason, note) in plan.events {
        publish(ctx, &reference, type_, &reason, note).await;
    }
    match plan.announced {
        Some(reason) => lock(&ctx.announced).insert(key.clone(), reason),
        None => lock(&ctx.announced).remove(&key),
    };
    let written = lock(&ctx.status_written).get(&key).copied();
    if status_write(pool.status.as_ref(), &plan.status, written, ctx.now()) {
        let pools: Api<WorkerPool> = Api::namespaced(ctx.client.clone(), &ns);
        pools
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(status_patch(pool.status.as_ref(), &plan.status)),
            )
            .await
            .map_err(Error::PatchStatus)?;
        lock(&ctx.status_written).insert(key.clone(), ctx.now());
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
