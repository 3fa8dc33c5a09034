//! The worker Deployment of a pool, built from its spec. Pure code.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PodSecurityContext, Probe, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use kube::ResourceExt;
use workerpool_queue::connection::Tls;
use workerpool_settings::{self as settings, WorkerSettings};

use crate::crd::WorkerPool;

/// Label that ties pods and the Deployment to their pool.
pub const POOL_LABEL: &str = "workerpool.dev/pool";
/// The label, and its value, that mark what this operator manages.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "workerpool-operator");
/// Port of the worker's `/healthz`, `/readyz` and `/metrics`.
pub const WORKER_PORT: i32 = 8080;
/// The worker image's non-root user and group.
pub const WORKER_UID: i64 = 65532;
/// The `emptyDir` volume mounted at `/tmp` when the root filesystem is
/// read-only.
pub const TMP_VOLUME: &str = "workerpool-tmp";
/// Where the Redis CA from `spec.queue.redis.tls.caSecretRef` is mounted.
pub const REDIS_CA_DIR: &str = "/etc/workerpool/redis-ca";
/// Where the client certificate Secret is mounted.
pub const REDIS_CLIENT_DIR: &str = "/etc/workerpool/redis-client";
/// Where the collector's CA from `spec.tracing.tls.caSecretRef` is mounted.
pub const OTEL_CA_DIR: &str = "/etc/workerpool/otel-ca";
/// Where the client certificate Secret of `spec.tracing.tls` is mounted.
pub const OTEL_CLIENT_DIR: &str = "/etc/workerpool/otel-client";
/// The Pod's own `emptyDir` that keeps the worker's instance file across
/// restarts of its container.
pub const INSTANCE_VOLUME: &str = "workerpool-instance";
/// Where [`INSTANCE_VOLUME`] is mounted in the worker container.
pub const INSTANCE_DIR: &str = "/run/workerpool";
/// The worker's `--instance-file`, in [`INSTANCE_DIR`].
pub const INSTANCE_FILE: &str = "/run/workerpool/instance";
/// The size limit of [`INSTANCE_VOLUME`]: it holds one short line and a
/// lock file.
const INSTANCE_VOLUME_SIZE: &str = "1Mi";

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
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
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

/// The settings every worker of `pool` gets, in a Deployment and in local
/// mode alike, with where Redis is and where the worker listens. The
/// schema keeps the numbers positive; one that is not becomes 0, which the
/// worker refuses at start naming its flag.
pub fn worker_settings(
    pool: &WorkerPool,
    redis_url: Option<String>,
    tls: Tls,
    listen: std::net::SocketAddr,
) -> WorkerSettings {
    let spec = &pool.spec;
    let worker = &spec.worker;
    let positive = |n: i32| u32::try_from(n).unwrap_or(0);
    WorkerSettings {
        redis_url,
        redis_mode: spec.queue.redis.mode.map(Into::into),
        tls,
        queues: spec.queue.redis.queue_names(),
        concurrency: positive(worker.concurrency),
        children: worker.children.map(positive),
        keep_outcomes: worker
            .keep_outcomes_seconds
            .map(|seconds| Duration::from_secs(positive(seconds).into())),
        max_attempts: positive(worker.max_attempts),
        max_payload_bytes: worker
            .max_payload_bytes
            .map(|b| u64::try_from(b).unwrap_or(0)),
        job_timeout: Duration::from_secs(positive(worker.job_timeout_seconds).into()),
        shutdown_timeout: Duration::from_millis(
            u64::try_from(shutdown_deadline_ms(spec.shutdown.grace_period_seconds)).unwrap_or(0),
        ),
        listen,
        rate_limit: worker.rate_limit.clone(),
        // Local mode runs without it; a Deployment's worker gets its Pod's
        // own (see `build`).
        instance_file: None,
    }
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
    // A template that mounts something of its own at the instance
    // directory keeps it (two mounts at one path are refused), and its
    // worker runs without the instance file: that directory may not be
    // private to the Pod.
    let instance_dir_free = !pod.containers[worker]
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == INSTANCE_DIR);
    inject(&mut pod.containers[worker], pool, instance_dir_free);
    mount_tls(pod, worker, pool);
    let pod_security = pod.security_context.clone().unwrap_or_default();
    if secure_by_default(&mut pod.containers[worker], &pod_security) {
        let volumes = pod.volumes.get_or_insert_with(Vec::new);
        if !volumes.iter().any(|v| v.name == TMP_VOLUME) {
            volumes.push(Volume {
                name: TMP_VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
        }
    }
    if instance_dir_free {
        mount_instance_dir(pod, worker);
    }

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

/// An environment variable with a plain value.
/// A variable the kubelet reads from a key of a Secret (which must exist).
fn from_secret(name: &str, secret: &crate::crd::SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.name.clone(),
                key: secret.key.clone(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn plain(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

/// Where the worker finds the TLS files of `spec.queue.redis.tls`, as
/// [`mount_tls`] mounts them.
fn mounted_tls(pool: &WorkerPool) -> Tls {
    let Some(tls) = &pool.spec.queue.redis.tls else {
        return Tls::default();
    };
    let client = tls.client_certificate_secret_ref.is_some();
    Tls {
        ca_file: tls
            .ca_secret_ref
            .as_ref()
            .map(|_| format!("{REDIS_CA_DIR}/ca.crt").into()),
        client_cert: client.then(|| format!("{REDIS_CLIENT_DIR}/tls.crt").into()),
        client_key: client.then(|| format!("{REDIS_CLIENT_DIR}/tls.key").into()),
        insecure_skip_verify: tls.insecure_skip_verify,
    }
}

/// A Secret mounted read-only into the worker container: the volume's
/// name, the Secret, which of its keys become which files (all, as they
/// are, with `None`), and the directory.
struct SecretMount {
    volume: &'static str,
    secret: String,
    items: Option<Vec<KeyToPath>>,
    dir: &'static str,
}

/// The mounts of a CA certificate (a Secret's key, as `ca.crt`) and a
/// client certificate (a `kubernetes.io/tls` Secret), each at its
/// `(volume, directory)`.
fn tls_mounts(
    ca: Option<&crate::crd::SecretKeyRef>,
    client: Option<&crate::crd::SecretRef>,
    ca_at: (&'static str, &'static str),
    client_at: (&'static str, &'static str),
) -> Vec<SecretMount> {
    let ca = ca.map(|ca| SecretMount {
        volume: ca_at.0,
        secret: ca.name.clone(),
        items: Some(vec![KeyToPath {
            key: ca.key.clone(),
            path: "ca.crt".into(),
            mode: None,
        }]),
        dir: ca_at.1,
    });
    let client = client.map(|client| SecretMount {
        volume: client_at.0,
        secret: client.name.clone(),
        items: None,
        dir: client_at.1,
    });
    ca.into_iter().chain(client).collect()
}

/// Mounts the Secrets of `spec.queue.redis.tls` and `spec.tracing.tls`
/// into the worker container (read-only, owner-readable) where
/// [`mounted_tls`] and [`tracing_tls_env`] point the worker.
fn mount_tls(pod: &mut k8s_openapi::api::core::v1::PodSpec, worker: usize, pool: &WorkerPool) {
    let mut wanted = Vec::new();
    if let Some(tls) = &pool.spec.queue.redis.tls {
        wanted.extend(tls_mounts(
            tls.ca_secret_ref.as_ref(),
            tls.client_certificate_secret_ref.as_ref(),
            ("workerpool-redis-ca", REDIS_CA_DIR),
            ("workerpool-redis-client", REDIS_CLIENT_DIR),
        ));
    }
    if let Some(tls) = pool.spec.tracing.as_ref().and_then(|t| t.tls.as_ref()) {
        wanted.extend(tls_mounts(
            tls.ca_secret_ref.as_ref(),
            tls.client_certificate_secret_ref.as_ref(),
            ("workerpool-otel-ca", OTEL_CA_DIR),
            ("workerpool-otel-client", OTEL_CLIENT_DIR),
        ));
    }
    let volumes: Vec<Volume> = wanted
        .iter()
        .map(|m| Volume {
            name: m.volume.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(m.secret.clone()),
                items: m.items.clone(),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        })
        .collect();
    let mounts: Vec<(&str, &str)> = wanted.iter().map(|m| (m.volume, m.dir)).collect();
    // The worker image's group can read the files whatever user runs it.
    if !volumes.is_empty() {
        let security = pod
            .security_context
            .get_or_insert_with(PodSecurityContext::default);
        if security.fs_group.is_none() {
            security.fs_group = Some(WORKER_UID);
        }
    }
    let container = &mut pod.containers[worker];
    let existing = container.volume_mounts.get_or_insert_with(Vec::new);
    for (name, path) in mounts {
        existing.push(VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    let all = pod.volumes.get_or_insert_with(Vec::new);
    all.retain(|v| !volumes.iter().any(|o| o.name == v.name));
    all.extend(volumes);
}

/// Mounts the Pod's own `emptyDir` at [`INSTANCE_DIR`] in the worker
/// container, for its [`INSTANCE_FILE`]. An `emptyDir` lives as long as
/// the Pod and is shared by no other Pod, and the kubelet runs one
/// instance of a container at a time: the file lets a restarted worker
/// take back its previous run's jobs at once (docs/queue-contract.md, "Lost
/// workers"). A volume of the template with the same name gives way.
fn mount_instance_dir(pod: &mut k8s_openapi::api::core::v1::PodSpec, worker: usize) {
    pod.containers[worker]
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: INSTANCE_VOLUME.into(),
            mount_path: INSTANCE_DIR.into(),
            ..VolumeMount::default()
        });
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != INSTANCE_VOLUME);
    volumes.push(Volume {
        name: INSTANCE_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity(INSTANCE_VOLUME_SIZE.into())),
        }),
        ..Volume::default()
    });
}

/// Gives the worker container the settings of the `restricted` Pod Security
/// Standard wherever the template leaves them unset: non-root (as the
/// worker image's user when no user is given), no privilege escalation, no
/// capabilities, the runtime's default seccomp profile, and a read-only root
/// filesystem with an `emptyDir` at `/tmp`. What the template says, on the
/// container or the pod, wins; other containers are left alone. Returns
/// whether the `/tmp` volume is needed.
///
/// See <https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted>.
pub fn secure_by_default(container: &mut Container, pod: &PodSecurityContext) -> bool {
    let sc = container
        .security_context
        .get_or_insert_with(SecurityContext::default);
    let non_root = sc.run_as_non_root.or(pod.run_as_non_root);
    if non_root.is_none() {
        sc.run_as_non_root = Some(true);
    }
    // A user is needed to prove non-root when the image names its user by
    // name (or is root); one given anywhere is kept, and so is an explicit
    // `runAsNonRoot: false` (run as the image says).
    if non_root != Some(false) && sc.run_as_user.is_none() && pod.run_as_user.is_none() {
        sc.run_as_user = Some(WORKER_UID);
        if sc.run_as_group.is_none() && pod.run_as_group.is_none() {
            sc.run_as_group = Some(WORKER_UID);
        }
    }
    // The API server refuses `allowPrivilegeEscalation: false` beside
    // `privileged: true` or the SYS_ADMIN capability.
    let adds_sys_admin = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .is_some_and(|a| a.iter().any(|c| c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN"));
    if sc.allow_privilege_escalation.is_none() && sc.privileged != Some(true) && !adds_sys_admin {
        sc.allow_privilege_escalation = Some(false);
    }
    let caps = sc.capabilities.get_or_insert_with(Capabilities::default);
    if caps.drop.is_none() {
        caps.drop = Some(vec!["ALL".into()]);
    }
    if sc.seccomp_profile.is_none() && pod.seccomp_profile.is_none() {
        sc.seccomp_profile = Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        });
    }
    let read_only = *sc.read_only_root_filesystem.get_or_insert(true);
    let has_tmp = container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/tmp");
    let needs_tmp = read_only && !has_tmp;
    if needs_tmp {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: TMP_VOLUME.into(),
                mount_path: "/tmp".into(),
                ..VolumeMount::default()
            });
    }
    needs_tmp
}

/// The `OTEL_*` variables `spec.tracing` asks for: the endpoint, the
/// service (the pool's name) and the resource (namespace, pool, pod), the
/// headers from their Secret, and the sampler when a percentage is set.
pub fn tracing_env(pool: &WorkerPool) -> Vec<EnvVar> {
    let Some(t) = &pool.spec.tracing else {
        return Vec::new();
    };
    let name = pool.metadata.name.clone().unwrap_or_default();
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let mut env = vec![
        plain("OTEL_EXPORTER_OTLP_ENDPOINT", t.endpoint.clone()),
        plain(
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            t.protocol.unwrap_or_default().as_str().into(),
        ),
        plain("OTEL_SERVICE_NAME", name.clone()),
        plain(
            "OTEL_RESOURCE_ATTRIBUTES",
            format!(
                "k8s.namespace.name={namespace},k8s.deployment.name={name},workerpool.pool={name},k8s.pod.name=$({})",
                settings::WORKER_ID
            ),
        ),
    ];
    if let Some(secret) = &t.headers_secret_ref {
        env.push(from_secret("OTEL_EXPORTER_OTLP_HEADERS", secret));
    }
    if let Some(percent) = t.sample_percent {
        env.push(plain(
            "OTEL_TRACES_SAMPLER",
            "parentbased_traceidratio".into(),
        ));
        env.push(plain(
            "OTEL_TRACES_SAMPLER_ARG",
            format!("{}", f64::from(percent.clamp(0, 100)) / 100.0),
        ));
    }
    env
}

/// The `OTEL_EXPORTER_OTLP_*` file variables of `spec.tracing.tls`, naming
/// the files [`mount_tls`] mounts (in the cluster only: local mode does not
/// read Secrets).
pub fn tracing_tls_env(pool: &WorkerPool) -> Vec<EnvVar> {
    let Some(tls) = pool.spec.tracing.as_ref().and_then(|t| t.tls.as_ref()) else {
        return Vec::new();
    };
    let mut env = Vec::new();
    if tls.ca_secret_ref.is_some() {
        env.push(plain(
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            format!("{OTEL_CA_DIR}/ca.crt"),
        ));
    }
    if tls.client_certificate_secret_ref.is_some() {
        env.push(plain(
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            format!("{OTEL_CLIENT_DIR}/tls.crt"),
        ));
        env.push(plain(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            format!("{OTEL_CLIENT_DIR}/tls.key"),
        ));
    }
    env
}

/// Adds the queue settings, the worker id, the instance file (with
/// `instance_file`), the port and the probes to the worker container.
/// Settings from the spec replace same-named variables the template sets,
/// so the spec stays the one source.
fn inject(container: &mut Container, pool: &WorkerPool, instance_file: bool) {
    let redis = &pool.spec.queue.redis;
    let mut ours = Vec::new();
    // A URL from a Secret is a reference the kubelet resolves, not a value.
    let url = match (&redis.url, &redis.url_secret_ref) {
        (_, Some(secret)) => {
            ours.push(from_secret(settings::REDIS_URL, secret));
            None
        }
        (url, None) => Some(url.clone().unwrap_or_default()),
    };
    let listen = std::net::SocketAddr::from(([0, 0, 0, 0], WORKER_PORT as u16));
    let mut settings = worker_settings(pool, url, mounted_tls(pool), listen);
    // In the cluster only: see mount_instance_dir.
    settings.instance_file = instance_file.then(|| INSTANCE_FILE.into());
    for (name, value) in settings.to_env() {
        ours.push(plain(name, value));
        // The pod's name, right after the address as it has always been,
        // so the pod template of a running pool does not change.
        if name == settings::LISTEN {
            ours.push(EnvVar {
                name: settings::WORKER_ID.into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.name".into(),
                        api_version: None,
                    }),
                    ..EnvVarSource::default()
                }),
            });
        }
    }
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| !ours.iter().any(|o| o.name == e.name));
    env.extend(ours);
    // Tracing: the standard variables, after the worker id they expand;
    // one the container sets itself wins.
    for var in tracing_env(pool).into_iter().chain(tracing_tls_env(pool)) {
        if !env.iter().any(|e| e.name == var.name) {
            env.push(var);
        }
    }

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
pub(crate) mod tests {
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
        let c = &pod_of(d).containers;
        let worker = c.iter().find(|c| c.name == "worker").expect("worker");
        serde_json::to_value(&worker.env).expect("json")
    }

    /// The value the worker container's variable `name` is set to.
    fn env_value(d: &Deployment, name: &str) -> Option<serde_json::Value> {
        env_of(d)
            .as_array()
            .and_then(|all| all.iter().find(|e| e["name"] == name))
            .map(|e| e["value"].clone())
    }

    #[test]
    fn tracing_injects_the_standard_variables_after_the_worker_id_and_the_template_wins() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r:6379", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w",
                "env": [{"name": "OTEL_SERVICE_NAME", "value": "mailer"}]}]}},
            "replicas": 1,
            "tracing": {"endpoint": "http://otel-collector.observability:4318",
                        "headersSecretRef": {"name": "otel", "key": "headers"},
                        "samplePercent": 25},
        }));
        let d = build(&p, 1).expect("deployment");
        let env = &pod_of(&d).containers[0].env.clone().unwrap_or_default();
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
                .unwrap_or_default()
        };
        let at = |name: &str| env.iter().position(|e| e.name == name);
        assert_eq!(
            value("OTEL_EXPORTER_OTLP_ENDPOINT"),
            "http://otel-collector.observability:4318"
        );
        assert_eq!(value("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf");
        assert_eq!(value("OTEL_SERVICE_NAME"), "mailer", "the template wins");
        assert_eq!(
            value("OTEL_RESOURCE_ATTRIBUTES"),
            "k8s.namespace.name=jobs,k8s.deployment.name=mail,workerpool.pool=mail,k8s.pod.name=$(WORKERPOOL_WORKER_ID)"
        );
        assert!(
            at("WORKERPOOL_WORKER_ID") < at("OTEL_RESOURCE_ATTRIBUTES"),
            "defined before it is expanded"
        );
        assert_eq!(value("OTEL_TRACES_SAMPLER"), "parentbased_traceidratio");
        assert_eq!(value("OTEL_TRACES_SAMPLER_ARG"), "0.25");
        let headers = env
            .iter()
            .find(|e| e.name == "OTEL_EXPORTER_OTLP_HEADERS")
            .expect("headers");
        let secret = headers
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("a Secret");
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str()),
            ("otel", "headers")
        );
        assert_eq!(
            env.iter().filter(|e| e.name == "OTEL_SERVICE_NAME").count(),
            1
        );

        let grpc = pool(json!({
            "queue": {"redis": {"url": "redis://r:6379", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
            "replicas": 1,
            "tracing": {"endpoint": "http://otel-collector.observability:4317", "protocol": "grpc"},
        }));
        let d = build(&grpc, 1).expect("deployment");
        let protocol = pod_of(&d).containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "OTEL_EXPORTER_OTLP_PROTOCOL")
            .and_then(|e| e.value.clone());
        assert_eq!(protocol.as_deref(), Some("grpc"));

        let untraced = pool(json!({
            "queue": {"redis": {"url": "redis://r:6379", "key": "mail"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
            "replicas": 1,
        }));
        let d = build(&untraced, 1).expect("deployment");
        assert!(
            pod_of(&d).containers[0]
                .env
                .iter()
                .flatten()
                .all(|e| !e.name.starts_with("OTEL_"))
        );
    }

    #[test]
    fn the_worker_container_gets_queue_settings_worker_id_probes_and_grace_period() {
        let p = pool(json!({
            "queue": {"redis": {"urlSecretRef": {"name": "redis", "key": "url"}, "keys": ["high", "low"]}},
            "template": {"metadata": {"labels": {"team": "mail"}}, "spec": {"containers": [
                {"name": "sidecar", "image": "envoy"},
                {"name": "worker", "image": "example/w:1", "env": [{"name": "WORKERPOOL_CONCURRENCY", "value": "99"}, {"name": "KEEP", "value": "me"}]}
            ]}},
            "worker": {"concurrency": 4, "maxAttempts": 3, "jobTimeoutSeconds": 120, "rateLimit": "600/1m", "maxPayloadBytes": 1048576},
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
                {"name": "WORKERPOOL_RATE_LIMIT", "value": "600/1m"},
                {"name": "WORKERPOOL_MAX_PAYLOAD_BYTES", "value": "1048576"},
                {"name": "WORKERPOOL_INSTANCE_FILE", "value": "/run/workerpool/instance"},
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
    fn children_in_the_spec_reach_the_worker_and_unset_leaves_one_per_slot() {
        let with = |worker: serde_json::Value| {
            let p = pool(json!({
                "queue": {"redis": {"url": "redis://r:6379", "key": "fetch"}},
                "template": {"spec": {"containers": [{"name": "worker", "image": "x"}]}},
                "worker": worker,
                "replicas": 1
            }));
            let env = env_of(&build(&p, 1).expect("build"));
            let value = |name: &str| {
                env.as_array()
                    .expect("env")
                    .iter()
                    .find(|v| v["name"] == name)
                    .map(|v| v["value"].clone())
            };
            (
                value("WORKERPOOL_CONCURRENCY"),
                value("WORKERPOOL_CHILDREN"),
            )
        };
        assert_eq!(
            with(json!({"concurrency": 50, "children": 1})),
            (Some(json!("50")), Some(json!("1")))
        );
        assert_eq!(
            with(json!({"concurrency": 10, "children": 3})),
            (Some(json!("10")), Some(json!("3")))
        );
        assert_eq!(with(json!({"concurrency": 4})), (Some(json!("4")), None));
    }

    #[test]
    fn keep_outcomes_in_the_spec_reach_the_worker_and_unset_keeps_only_jobs_that_ask() {
        let with = |worker: serde_json::Value| {
            let p = pool(json!({
                "queue": {"redis": {"url": "redis://r:6379", "key": "fetch"}},
                "template": {"spec": {"containers": [{"name": "worker", "image": "x"}]}},
                "worker": worker,
                "replicas": 1
            }));
            let env = env_of(&build(&p, 1).expect("build"));
            env.as_array()
                .expect("env")
                .iter()
                .find(|v| v["name"] == settings::KEEP_OUTCOMES)
                .map(|v| v["value"].as_str().expect("a value").to_string())
        };
        let written = with(json!({"keepOutcomesSeconds": 86400})).expect("set");
        assert_eq!(written, "86400s");
        // Read back as the worker's flag reads it.
        assert_eq!(
            humantime::parse_duration(&written),
            Ok(Duration::from_secs(86_400))
        );
        let week = with(json!({"keepOutcomesSeconds": 604800})).expect("set");
        assert_eq!(
            humantime::parse_duration(&week),
            Ok(workerpool_queue::ops::MAX_KEEP)
        );
        assert_eq!(with(json!({"concurrency": 4})), None);
    }

    #[test]
    fn a_redis_mode_in_the_spec_reaches_the_worker_and_none_leaves_it_asking() {
        let with = |mode: serde_json::Value| {
            let mut redis = json!({"url": "redis://r:6379", "key": "{q}"});
            if !mode.is_null() {
                redis["mode"] = mode;
            }
            let p = pool(json!({
                "queue": {"redis": redis},
                "template": {"spec": {"containers": [{"name": "worker", "image": "x"}]}},
                "replicas": 1
            }));
            let env = env_of(&build(&p, 1).expect("build"));
            env.as_array()
                .expect("env")
                .iter()
                .find(|v| v["name"] == "WORKERPOOL_REDIS_MODE")
                .map(|v| v["value"].clone())
        };
        assert_eq!(with(json!("Cluster")), Some(json!("cluster")));
        assert_eq!(with(json!("Standalone")), Some(json!("standalone")));
        assert_eq!(with(serde_json::Value::Null), None);
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

    fn pod_of(d: &Deployment) -> &k8s_openapi::api::core::v1::PodSpec {
        d.spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod")
    }

    fn security(d: &Deployment, container: &str) -> serde_json::Value {
        let c = pod_of(d)
            .containers
            .iter()
            .find(|c| c.name == container)
            .expect("container");
        serde_json::to_value(&c.security_context).expect("json")
    }

    #[test]
    fn the_worker_gets_the_restricted_profile_and_a_tmp_volume_by_default() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {"containers": [
                {"name": "worker", "image": "w"},
                {"name": "sidecar", "image": "s"}
            ]}},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        assert_eq!(
            security(&d, "worker"),
            json!({
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}, "readOnlyRootFilesystem": true
            })
        );
        assert_eq!(
            security(&d, "sidecar"),
            json!(null),
            "other containers are left alone"
        );
        let pod = pod_of(&d);
        assert_eq!(
            serde_json::to_value(&pod.volumes).expect("json"),
            json!([
                {"name": "workerpool-tmp", "emptyDir": {}},
                {"name": "workerpool-instance", "emptyDir": {"sizeLimit": "1Mi"}}
            ])
        );
        let worker = pod
            .containers
            .iter()
            .find(|c| c.name == "worker")
            .expect("worker");
        assert_eq!(
            serde_json::to_value(&worker.volume_mounts).expect("json"),
            json!([
                {"name": "workerpool-tmp", "mountPath": "/tmp"},
                {"name": "workerpool-instance", "mountPath": "/run/workerpool"}
            ])
        );
    }

    #[test]
    fn what_the_template_says_about_security_wins_field_by_field() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {
                "securityContext": {"runAsUser": 1000, "seccompProfile": {"type": "Unconfined"}},
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{"name": "worker", "image": "w",
                    "securityContext": {"readOnlyRootFilesystem": false,
                                        "capabilities": {"add": ["NET_BIND_SERVICE"]}},
                    "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}]}]
            }},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        assert_eq!(
            security(&d, "worker"),
            json!({
                "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                "readOnlyRootFilesystem": false
            }),
            "the pod's user and seccomp profile are kept, not overridden per container"
        );
        assert_eq!(
            volume_names(&d),
            ["scratch", "workerpool-instance"],
            "no /tmp of ours beside the template's"
        );
    }

    #[test]
    fn privileged_or_root_on_request_is_built_as_asked() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w",
                "securityContext": {"privileged": true, "runAsNonRoot": false}}]}},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        let sc = security(&d, "worker");
        assert_eq!(sc["privileged"], json!(true));
        assert_eq!(sc["runAsNonRoot"], json!(false));
        assert!(
            sc.get("allowPrivilegeEscalation").is_none(),
            "the API server refuses it beside privileged: {sc}"
        );
        assert!(sc.get("runAsUser").is_none(), "the image's user: {sc}");
        // A /tmp mounted by the user is not mounted twice.
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w",
                "volumeMounts": [{"name": "t", "mountPath": "/tmp"}]}],
                "volumes": [{"name": "t", "emptyDir": {"medium": "Memory"}}]}},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        assert_eq!(volume_names(&d), ["t", "workerpool-instance"]);
    }

    #[test]
    fn tls_secrets_are_mounted_read_only_and_the_worker_pointed_at_them() {
        let p = pool(json!({
            "queue": {"redis": {"url": "rediss://r:6380", "key": "q", "tls": {
                "caSecretRef": {"name": "redis-ca", "key": "ca.pem"},
                "clientCertificateSecretRef": {"name": "redis-client"}
            }}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        let value = |name: &str| env_value(&d, name);
        assert_eq!(
            value("WORKERPOOL_REDIS_CA_FILE"),
            Some(json!("/etc/workerpool/redis-ca/ca.crt"))
        );
        assert_eq!(
            value("WORKERPOOL_REDIS_CLIENT_KEY"),
            Some(json!("/etc/workerpool/redis-client/tls.key"))
        );
        let pod = pod_of(&d);
        let volumes = serde_json::to_value(&pod.volumes).expect("json");
        assert_eq!(
            volumes[0],
            json!({"name": "workerpool-redis-ca", "secret": {"secretName": "redis-ca",
                   "items": [{"key": "ca.pem", "path": "ca.crt"}], "defaultMode": 288}})
        );
        assert_eq!(volumes[1]["secret"]["secretName"], json!("redis-client"));
        assert_eq!(volumes[2]["name"], json!("workerpool-tmp"));
        let worker = &pod.containers[0];
        let mounts = serde_json::to_value(&worker.volume_mounts).expect("json");
        assert_eq!(
            mounts[0],
            json!({"name": "workerpool-redis-ca", "mountPath": "/etc/workerpool/redis-ca", "readOnly": true})
        );
        assert_eq!(
            pod.security_context.as_ref().and_then(|s| s.fs_group),
            Some(65532)
        );

        // The collector's: mounted beside Redis's, named in the OTLP file
        // variables; a variable the container sets itself wins.
        let p = pool(json!({
            "queue": {"redis": {"url": "rediss://r:6380", "key": "q", "tls": {
                "caSecretRef": {"name": "redis-ca", "key": "ca.pem"}}}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w",
                "env": [{"name": "OTEL_EXPORTER_OTLP_CERTIFICATE", "value": "/mine/ca.pem"}]}]}},
            "replicas": 1,
            "tracing": {"endpoint": "https://otel:4318", "tls": {
                "caSecretRef": {"name": "otel-ca", "key": "ca.pem"},
                "clientCertificateSecretRef": {"name": "otel-client"}}},
        }));
        let d = build(&p, 1).expect("build");
        let value = |name: &str| env_value(&d, name);
        assert_eq!(
            value("OTEL_EXPORTER_OTLP_CERTIFICATE"),
            Some(json!("/mine/ca.pem"))
        );
        assert_eq!(
            value("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
            Some(json!("/etc/workerpool/otel-client/tls.crt"))
        );
        assert_eq!(
            value("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
            Some(json!("/etc/workerpool/otel-client/tls.key"))
        );
        let pod = pod_of(&d);
        let volumes = serde_json::to_value(&pod.volumes).expect("json");
        let names: Vec<&str> = volumes
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "workerpool-redis-ca",
                "workerpool-otel-ca",
                "workerpool-otel-client",
                "workerpool-tmp",
                "workerpool-instance"
            ]
        );
        assert_eq!(
            volumes[1]["secret"],
            json!({"secretName": "otel-ca", "items": [{"key": "ca.pem", "path": "ca.crt"}], "defaultMode": 288})
        );
        let mounts = serde_json::to_value(&pod.containers[0].volume_mounts).expect("json");
        assert_eq!(
            mounts[2],
            json!({"name": "workerpool-otel-client", "mountPath": "/etc/workerpool/otel-client", "readOnly": true})
        );
    }

    fn volume_names(d: &Deployment) -> Vec<String> {
        pod_of(d)
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.clone())
            .collect()
    }

    /// The worker's instance file lives in the Pod's own emptyDir, kept
    /// across restarts of its container and shared with no other Pod.
    #[test]
    fn the_worker_gets_an_instance_file_in_an_emptydir_of_its_pod() {
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "workerpool-instance", "hostPath": {"path": "/var/shared"}}
                ],
                "containers": [
                    {"name": "worker", "image": "w",
                     "env": [{"name": "WORKERPOOL_INSTANCE_FILE", "value": "/data/mine"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                    {"name": "sidecar", "image": "s"}
                ]
            }},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        assert_eq!(
            env_value(&d, "WORKERPOOL_INSTANCE_FILE"),
            Some(json!("/run/workerpool/instance")),
            "the operator's path replaces the template's"
        );
        let pod = pod_of(&d);
        let volumes = serde_json::to_value(&pod.volumes).expect("json");
        assert_eq!(
            volumes,
            json!([
                {"name": "data", "emptyDir": {}},
                {"name": "workerpool-tmp", "emptyDir": {}},
                {"name": "workerpool-instance", "emptyDir": {"sizeLimit": "1Mi"}}
            ]),
            "a template volume of the operator's name gives way: the directory must be the Pod's own"
        );
        let worker = pod
            .containers
            .iter()
            .find(|c| c.name == "worker")
            .expect("worker");
        let mounts = serde_json::to_value(&worker.volume_mounts).expect("json");
        assert_eq!(
            mounts.as_array().and_then(|m| m.last()),
            Some(&json!({"name": "workerpool-instance", "mountPath": "/run/workerpool"})),
            "{mounts}"
        );
        let sidecar = pod
            .containers
            .iter()
            .find(|c| c.name == "sidecar")
            .expect("sidecar");
        assert!(sidecar.volume_mounts.is_none(), "only the worker mounts it");

        // A template that mounts its own volume at that directory keeps it,
        // and its worker runs without the file (today's shared-id rule):
        // that volume may not be private to the Pod.
        let p = pool(json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {
                "volumes": [{"name": "run", "emptyDir": {}}],
                "containers": [{"name": "worker", "image": "w",
                    "volumeMounts": [{"name": "run", "mountPath": "/run/workerpool/"}]}]
            }},
            "replicas": 1
        }));
        let d = build(&p, 1).expect("build");
        assert_eq!(env_value(&d, "WORKERPOOL_INSTANCE_FILE"), None);
        assert_eq!(volume_names(&d), ["run", "workerpool-tmp"]);
    }

    #[test]
    fn the_shutdown_deadline_leaves_a_quarter_of_the_grace_period_up_to_five_seconds() {
        assert_eq!(shutdown_deadline_ms(30), 25_000);
        assert_eq!(shutdown_deadline_ms(60), 55_000);
        assert_eq!(shutdown_deadline_ms(8), 6_000);
        assert_eq!(shutdown_deadline_ms(1), 750);
    }
}
