//! A WorkerPool object that does not read as a WorkerPool: skipped, and
//! said so on the object itself, where its owner looks.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::Context;
use super::apply::publish;
use crate::crd::WorkerPool;
use crate::events::EventType;
use crate::watched::Unreadable;

/// The reason of the `Ready` condition and of the event of a pool that
/// does not read.
pub const POOL_UNREADABLE: &str = "PoolUnreadable";

/// What the pool's `Ready` condition says about `object`.
pub(super) fn message(object: &Unreadable) -> String {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    workerpool_queue::text::safe_line(
        &format!(
            "the operator cannot read this WorkerPool, so it does not reconcile it: {}. Fix that field (kubectl edit workerpool {name} -n {namespace})",
            object.error
        ),
        2048,
    )
}

/// The conditions of `object` with `Ready` saying why it is skipped, at
/// `now`; `None` when its `Ready` condition says so already (a restarted
/// operator writes and announces nothing new).
pub(super) fn conditions(object: &Unreadable, now: Timestamp) -> Option<Vec<Value>> {
    let message = message(object);
    let generation = object.metadata.generation;
    let previous = object.conditions.iter().find(|c| c["type"] == "Ready");
    if previous.is_some_and(|c| {
        c["status"] == "False"
            && c["reason"] == POOL_UNREADABLE
            && c["message"] == message.as_str()
            && c["observedGeneration"].as_i64() == generation
    }) {
        return None;
    }
    let since = previous
        .filter(|c| c["status"] == "False")
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(Time(now)));
    let mut conditions: Vec<Value> = object
        .conditions
        .iter()
        .filter(|c| c["type"] != "Ready")
        .cloned()
        .collect();
    conditions.push(json!({
        "type": "Ready",
        "status": "False",
        "reason": POOL_UNREADABLE,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }));
    Some(conditions)
}

/// Reports `object`, which is skipped until it reads: a log line naming it
/// and its field, the `workerpool_pool_unreadable` gauge, and, once per
/// problem, a Warning event and its `Ready` condition.
pub(super) async fn report(object: &Unreadable, ctx: &Context) -> Result<(), kube::Error> {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    tracing::warn!(
        pool = %format!("{namespace}/{name}"),
        error = %object.error,
        "cannot read this WorkerPool; it is skipped until it is fixed"
    );
    ctx.metrics
        .unreadable
        .with_label_values(&[namespace, name])
        .set(1);
    let Some(conditions) = conditions(object, Timestamp::now()) else {
        return Ok(());
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(<WorkerPool as kube::Resource>::api_version(&()).into()),
        kind: Some(<WorkerPool as kube::Resource>::kind(&()).into()),
        name: object.metadata.name.clone(),
        namespace: object.metadata.namespace.clone(),
        uid: object.metadata.uid.clone(),
        ..Default::default()
    };
    publish(
        ctx,
        &reference,
        EventType::Warning,
        POOL_UNREADABLE,
        message(object),
    )
    .await;
    // Untyped: the typed pool is what does not read, and the API server
    // answers a status patch with the whole object.
    let pools: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &ApiResource::erase::<WorkerPool>(&()),
    );
    pools
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await?;
    Ok(())
}
