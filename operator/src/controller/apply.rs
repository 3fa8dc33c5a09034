//! Carries out a plan: deletion costs, the Deployment, events, status.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::observe::Observed;
use super::plan::ready_reason;
use super::plan::{BudgetWrite, Plan};
use super::pods::{list_pods, mark_idle_pods};
use super::status::{log_transitions, refused as refused_status, status_patch};
use super::{Context, Error, MANAGER, pool_key};
use crate::crd::{WorkerPool, WorkerPoolStatus};
use crate::disruption::{Change, PodChange};
use crate::events::{EventType, Note};
use crate::metrics::Replicas;
use crate::workload;

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
    ctx.metrics
        .observe_saturation(&ns, &name, plan.saturation.as_ref());
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
        let live = match deployments
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&plan.deployment),
            )
            .await
        {
            Ok(live) => live,
            Err(kube::Error::Api(e)) if refusal(e.code) => {
                return Err(refused(pool, ctx, plan.status, *e).await);
            }
            Err(e) => return Err(Error::ApplyDeployment(e)),
        };
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
    protect(pool, ctx, &plan.protection).await?;
    ctx.metrics
        .protected_pods
        .with_label_values(&[&ns, &name])
        .set(i64::from(plan.status.protected_pods.unwrap_or(0)));
    write_budget(pool, ctx, &plan.budget).await?;
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

/// Whether an API server's answer of `code` to an apply refuses what was
/// sent, so that sending it again changes nothing until the spec or the
/// cluster does: a client error, but a conflict or a rate limit, which pass.
fn refusal(code: u16) -> bool {
    (400..500).contains(&code) && code != 409 && code != 429
}

/// Tells that the API server refused the pool's Deployment with `answer`:
/// a Warning event (once, as the refusal starts) and the `Ready` condition
/// with the API server's message, in the status `status`; the error the
/// reconcile ends with.
async fn refused(
    pool: &WorkerPool,
    ctx: &Context,
    status: WorkerPoolStatus,
    answer: kube::core::Status,
) -> Error {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let message = workerpool_queue::text::safe_line(
        &format!(
            "the API server refused Deployment {ns}/{name} ({} {}): {}",
            answer.code, answer.reason, answer.message
        ),
        1024,
    );
    let status = refused_status(pool, status, &message, jiff::Timestamp::now());
    let key = pool_key(pool);
    log_transitions(&key, pool.status.as_ref(), &status);
    if ready_reason(pool) != Some(workload::DEPLOYMENT_REFUSED) {
        let reference = pool.object_ref(&());
        publish(
            ctx,
            &reference,
            EventType::Warning,
            workload::DEPLOYMENT_REFUSED,
            message,
        )
        .await;
    }
    let pools: Api<WorkerPool> = Api::namespaced(ctx.client.clone(), &ns);
    if let Err(e) = pools
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(status_patch(pool.status.as_ref(), &status)),
        )
        .await
    {
        tracing::warn!(pool = %key, error = %e, "cannot write the refusal into the status");
    } else {
        let now = ctx.now();
        ctx.pool(&key, |m| m.status_written = Some(now));
    }
    Error::ApplyDeployment(kube::Error::Api(Box::new(answer)))
}

/// Sends each pod's disruption marks, one merge patch per pod; a pod
/// deleted meanwhile is skipped.
async fn protect(pool: &WorkerPool, ctx: &Context, changes: &[PodChange]) -> Result<(), Error> {
    if changes.is_empty() {
        return Ok(());
    }
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for c in changes {
        let label = match c.change {
            Change::Protect => "protect",
            Change::Release => "release",
        };
        match pods
            .patch(&c.pod, &PatchParams::default(), &Patch::Merge(&c.patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(Error::PatchPod(e)),
        }
        ctx.metrics
            .protection_patches
            .with_label_values(&[&ns, &name, label])
            .inc();
        tracing::info!(pool = %pool_key(pool), pod = %c.pod, "{}", match c.change {
            Change::Protect => "protected from node disruption: its worker holds a long job",
            Change::Release => "no longer protected from node disruption",
        });
    }
    Ok(())
}

/// Applies or deletes the pool's PodDisruptionBudget.
async fn write_budget(pool: &WorkerPool, ctx: &Context, write: &BudgetWrite) -> Result<(), Error> {
    let budgets: Api<PodDisruptionBudget> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    match write {
        BudgetWrite::Keep => Ok(()),
        BudgetWrite::Apply(budget) => {
            let name = budget.metadata.name.clone().unwrap_or_default();
            budgets
                .patch(
                    &name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(budget.as_ref()),
                )
                .await
                .map(|_| ())
                .map_err(Error::WriteBudget)
        }
        BudgetWrite::Delete(name) => match budgets.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(Error::WriteBudget(e)),
        },
    }
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
