//! The worker Deployment of a pool, built from its spec. Pure code.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, Probe,
    SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use kube::ResourceExt;

use crate::crd::WorkerPool;

/// Label that ties pods and the Deployment to their pool.
pub const POOL_LABEL: &str = "workerpool.dev/pool";
/// Port of the worker's `/healthz`, `/readyz` and `/metrics`.
pub const WORKER_PORT: i32 = 8080;

/// Why a pool's Deployment cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// No container to run the worker in.
    #[error(
        "spec.template.spec.containers must contain a container named `worker`, or exactly one container"
    )]
    NoWorkerContainer,
    /// The object lacks what the API server always sets.
    #[error("the WorkerPool has no {0}")]
    MissingMetadata(&'static str),
}

/// The label selector of a pool's pods, as a string (`status.selector`).
pub fn selector(pool_name: &str) -> String {
    format!("{POOL_LABEL}={pool_name}")
}

/// Labels the operator puts on a pool's Deployment and pods.
pub fn labels(pool_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "workerpool-worker".into()),
        ("app.kubernetes.io/instance".into(), pool_name.into()),
        (
            "app.kubernetes.io/managed-by".into(),
            "workerpool-operator".into(),
        ),
        (POOL_LABEL.into(), pool_name.into()),
    ])
}

/// The worker's shutdown deadline for a grace period: it must return its
/// unfinished jobs before the kubelet's SIGKILL, so it leaves a margin of a
/// quarter of the grace period, at most 5 s.
pub fn shutdown_deadline_ms(grace_period_seconds: i32) -> i64 {
    let grace_ms = i64::from(grace_period_seconds.max(1)) * 1000;
    grace_ms - (grace_ms / 4).min(5000)
}

/// The Deployment that runs a pool's workers, `replicas` of them.
pub fn build(pool: &WorkerPool, replicas: i32) -> Result<Deployment, BuildError> {
    let name = pool
        .metadata
        .name
        .clone()
        .ok_or(BuildError::MissingMetadata("name"))?;
    let owner = pool
        .controller_owner_ref(&())
        .ok_or(BuildError::MissingMetadata("uid"))?;
    let spec = &pool.spec;
    let mut template = spec.template.clone();
    let pod_meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    pod_meta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels(&name));
    let pod = template.spec.get_or_insert_with(Default::default);
    pod.termination_grace_period_seconds = Some(i64::from(spec.shutdown.grace_period_seconds));
    let worker = match pod.containers.iter().position(|c| c.name == "worker") {
        Some(i) => i,
        None if pod.containers.len() == 1 => 0,
        None => return Err(BuildError::NoWorkerContainer),
    };
    inject(&mut pod.containers[worker], pool);

    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: pool.namespace(),
            labels: Some(labels(&name)),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(POOL_LABEL.to_string(), name.clone())])),
                ..LabelSelector::default()
            },
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// Adds the queue settings, the worker id, the port and the probes to the
/// worker container. Settings from the spec replace same-named variables
/// the template sets, so the spec stays the one source.
fn inject(container: &mut Container, pool: &WorkerPool) {
    let spec = &pool.spec;
    let redis = &spec.queue.redis;
    let plain = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    let url = match (&redis.url, &redis.url_secret_ref) {
        (_, Some(secret)) => EnvVar {
            name: "WORKERPOOL_REDIS_URL".into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.name.clone(),
                    key: secret.key.clone(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
        },
        (url, None) => plain("WORKERPOOL_REDIS_URL", url.clone().unwrap_or_default()),
    };
    let ours = vec![
        url,
        plain("WORKERPOOL_QUEUE", redis.queue_names().join(",")),
        plain(
            "WORKERPOOL_CONCURRENCY",
            spec.worker.concurrency.to_string(),
        ),
        plain(
            "WORKERPOOL_MAX_ATTEMPTS",
            spec.worker.max_attempts.to_string(),
        ),
        plain(
            "WORKERPOOL_JOB_TIMEOUT",
            format!("{}s", spec.worker.job_timeout_seconds),
        ),
        plain(
            "WORKERPOOL_SHUTDOWN_TIMEOUT",
            format!(
                "{}ms",
                shutdown_deadline_ms(spec.shutdown.grace_period_seconds)
            ),
        ),
        plain("WORKERPOOL_LISTEN", format!("0.0.0.0:{WORKER_PORT}")),
        EnvVar {
            name: "WORKERPOOL_WORKER_ID".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        },
    ];
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| !ours.iter().any(|o| o.name == e.name));
    env.extend(ours);

    let ports = container.ports.get_or_insert_with(Vec::new);
    if !ports.iter().any(|p| p.container_port == WORKER_PORT) {
        ports.push(ContainerPort {
            name: Some("http".into()),
            container_port: WORKER_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(WORKER_PORT),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    container
        .liveness_probe
        .get_or_insert_with(|| probe("/healthz", 10, 3));
    container
        .readiness_probe
        .get_or_insert_with(|| probe("/readyz", 5, 1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn pool(spec: serde_json::Value) -> WorkerPool {
        serde_json::from_value(json!({
            "apiVersion": "workerpool.dev/v1alpha1",
            "kind": "WorkerPool",
            "metadata": {"name": "mail", "namespace": "jobs", "uid": "u-1"},
            "spec": spec,
        }))
        .expect("pool")
    }

    fn env_of(d: &Deployment) -> serde_json::Value {
        let c = &d
            .spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod")
            .containers;
        let worker = c.iter().find(|c| c.name == "worker").expect("worker");
        serde_json::to_value(&worker.env).expect("json")
    }

    #[test]
    fn the_worker_container_gets_queue_settings_worker_id_probes_and_grace_period() {
        let p = pool(json!({
            "queue": {"redis": {"urlSecretRef": {"name": "redis", "key": "url"}, "keys": ["high", "low"]}},
            "template": {"metadata": {"labels": {"team": "mail"}}, "spec": {"containers": [
                {"name": "sidecar", "image": "envoy"},
                {"name": "worker", "image": "example/w:1", "env": [{"name": "WORKERPOOL_CONCURRENCY", "value": "99"}, {"name": "KEEP", "value": "me"}]}
            ]}},
            "worker": {"concurrency": 4, "maxAttempts": 3, "jobTimeoutSeconds": 120},
            "shutdown": {"gracePeriodSeconds": 60},
            "scaling": {}
        }));
        let d = build(&p, 3).expect("build");
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(
            spec.selector.match_labels.as_ref().expect("labels")[POOL_LABEL],
            "mail"
        );
        let pod = spec.template.spec.as_ref().expect("pod");
        assert_eq!(pod.termination_grace_period_seconds, Some(60));
        let labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .expect("labels");
        assert_eq!(
            (labels["team"].as_str(), labels[POOL_LABEL].as_str()),
            ("mail", "mail")
        );
        assert_eq!(
            env_of(&d),
            json!([
                {"name": "KEEP", "value": "me"},
                {"name": "WORKERPOOL_REDIS_URL", "valueFrom": {"secretKeyRef": {"name": "redis", "key": "url", "optional": false}}},
                {"name": "WORKERPOOL_QUEUE", "value": "high,low"},
                {"name": "WORKERPOOL_CONCURRENCY", "value": "4"},
                {"name": "WORKERPOOL_MAX_ATTEMPTS", "value": "3"},
                {"name": "WORKERPOOL_JOB_TIMEOUT", "value": "120s"},
                {"name": "WORKERPOOL_SHUTDOWN_TIMEOUT", "value": "55000ms"},
                {"name": "WORKERPOOL_LISTEN", "value": "0.0.0.0:8080"},
                {"name": "WORKERPOOL_WORKER_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ])
        );
        let worker = pod
            .containers
            .iter()
            .find(|c| c.name == "worker")
            .expect("worker");
        let readiness = worker
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("probe");
        assert_eq!(readiness.path.as_deref(), Some("/readyz"));
        let sidecar = &pod.containers[0];
        assert!(
            sidecar.env.is_none() && sidecar.readiness_probe.is_none(),
            "sidecars are left alone"
        );
        let owner = &d.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("WorkerPool", "u-1", Some(true))
        );
    }

    #[test]
    fn the_only_container_is_the_worker_whatever_its_name_and_user_probes_are_kept() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r:6379", "key": "q"}},
            "template": {"spec": {"containers": [{"name": "app", "image": "x", "readinessProbe": {"exec": {"command": ["true"]}}}]}},
            "replicas": 2
        }));
        let d = build(&p, 2).expect("build");
        let c = &d
            .spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod")
            .containers[0];
        assert!(
            c.readiness_probe
                .as_ref()
                .and_then(|p| p.exec.as_ref())
                .is_some()
        );
        assert!(c.liveness_probe.is_some());
        assert_eq!(
            c.env.as_ref().expect("env")[0].value.as_deref(),
            Some("redis://r:6379")
        );
    }

    #[test]
    fn several_containers_without_one_named_worker_are_refused() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}},
            "replicas": 1
        }));
        assert_eq!(build(&p, 1), Err(BuildError::NoWorkerContainer));
    }

    #[test]
    fn the_shutdown_deadline_leaves_a_quarter_of_the_grace_period_up_to_five_seconds() {
        assert_eq!(shutdown_deadline_ms(30), 25_000);
        assert_eq!(shutdown_deadline_ms(60), 55_000);
        assert_eq!(shutdown_deadline_ms(8), 6_000);
        assert_eq!(shutdown_deadline_ms(1), 750);
    }
}
