//! The `WorkerPool` custom resource (`workerpool.dev/v1alpha1`, short name `wp`).
//!
//! The `///` comments on spec and status fields are the descriptions that
//! `kubectl explain workerpool.spec…` shows: they are written for users.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::crd::CustomResourceExt;
use kube::core::{Message, Rule};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use workerpool_queue::keys::KEY_PARTS;

use crate::scaling::ScalingSpec;

/// A pool of background-job workers taking jobs from a Redis queue, run as a
/// Deployment whose size the operator sets from the queue's depth and flow
/// (`spec.scaling`), or fixed (`spec.replicas`, which `kubectl scale` and an
/// HPA can drive).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "workerpool.dev",
    version = "v1alpha1",
    kind = "WorkerPool",
    plural = "workerpools",
    shortname = "wp",
    namespaced,
    status = "WorkerPoolStatus",
    derive = "PartialEq",
    cel,
    doc = "A pool of background-job workers scaled on its Redis queue",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Backlog","type":"integer","jsonPath":".status.backlog","description":"Jobs waiting, including due retries"}"#,
    printcolumn = r#"{"name":"In-Flight","type":"integer","jsonPath":".status.inFlight","description":"Jobs in workers' hands (a lost worker's until the reaper returns them)"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredReplicas","description":"Workers wanted"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas","description":"Workers ready"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","description":"The most important problem first: the queue cannot be read (RedisUnreachable, SecretNotFound ...), the workers do not run (FailedCreate, ImagePullBackOff, CrashLoopBackOff ...) or their handler cannot (HandlerFailing), jobs are being dead-lettered (JobsFailing); else WorkersStarting or WorkersReady"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason","description":"Why the pool has this size","priority":1}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","description":"The Ready condition's message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.replicas) != has(self.scaling)").message("set exactly one of spec.replicas (a fixed number of workers) or spec.scaling (workers scaled on the queue)"))]
#[x_kube(validation = Rule::new("!has(self.schedules) || self.schedules.all(s, self.schedules.exists_one(t, t.name == s.name))").message("spec.schedules: each schedule needs a name of its own"))]
#[x_kube(validation = Rule::new("!has(self.schedules) || self.schedules.all(s, !has(s.queue) || (has(self.queue.redis.key) ? s.queue == self.queue.redis.key : self.queue.redis.keys.exists(k, k == s.queue)))").message("spec.schedules[].queue must be one of the pool's queues (spec.queue.redis.key or spec.queue.redis.keys)"))]
#[x_kube(validation = Rule::new("!has(self.scaling) || (has(self.scaling.minReplicas) ? self.scaling.minReplicas : 0) <= (has(self.scaling.maxReplicas) ? self.scaling.maxReplicas : 100)").message("spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas"))]
#[x_kube(validation = Rule::new("!has(self.disruption) || !has(self.disruption.minAvailable) || self.disruption.minAvailable < (has(self.scaling) ? (has(self.scaling.minReplicas) ? self.scaling.minReplicas : 0) : (has(self.replicas) ? self.replicas : 0))").message("spec.disruption.minAvailable must be below the fewest workers the pool runs (spec.scaling.minReplicas, or spec.replicas): a budget that asks for every worker blocks each drain of their nodes forever. Lower it, raise the minimum, or use maxUnavailable (a pool that scales to zero can only use maxUnavailable)"))]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolSpec {
    /// Where the jobs come from.
    pub queue: QueueSpec,

    /// The worker pods, as in a Deployment: image, resources, volumes,
    /// sidecars. The container named `worker` (or the only container) runs
    /// `workerpool-worker`; the operator adds the queue settings as
    /// `WORKERPOOL_*` environment variables, the worker id, the health
    /// probes and the termination grace period.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,

    /// Settings of each worker process.
    #[serde(default)]
    pub worker: WorkerSettings,

    /// A fixed number of workers. Set this or `scaling`, not both.
    /// `kubectl scale workerpool` and a HorizontalPodAutoscaler write here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,

    /// Scale the workers on the queue. Set this or `replicas`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,

    /// How workers stop.
    #[serde(default)]
    pub shutdown: ShutdownSpec,

    /// Jobs enqueued on a recurring schedule, as a CronJob would start
    /// them: each fire is one job on the pool's queue, enqueued once however
    /// many operators run. A pool at zero wakes for it like for any job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub schedules: Vec<ScheduleSpec>,

    /// How the workers meet node disruption (a drain, a node autoscaler's
    /// consolidation, a spot reclaim): marks on the pods of busy workers,
    /// and a PodDisruptionBudget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<DisruptionSpec>,

    /// Trace every attempt with OpenTelemetry: the workers export a span
    /// per attempt, a child of the producer's `traceparent`, to this
    /// collector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingSpec>,
}

/// OpenTelemetry for the workers, injected as the standard `OTEL_*`
/// variables (a variable the worker container sets itself wins).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.endpoint.matches('^https?://[^/?#]+(/.*)?$')").message("spec.tracing.endpoint must be an http:// or https:// URL of an OTLP receiver, such as an OpenTelemetry Collector's port 4318 (http://otel-collector.observability:4318), or its port 4317 with protocol: grpc"))]
#[x_kube(validation = Rule::new("!has(self.tls) || self.endpoint.startsWith('https://')").message("spec.tracing.tls needs an https:// endpoint: the CA and client certificate are for a collector that speaks TLS"))]
#[serde(rename_all = "camelCase")]
pub struct TracingSpec {
    /// The OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`): over
    /// `http/protobuf`, spans go to its `/v1/traces` (a Collector's port
    /// 4318); over `grpc`, to its `TraceService` (port 4317; an http:// one
    /// is HTTP/2 without TLS). An https:// one is checked against the
    /// system's roots, and the CA of `tls` when one is given.
    #[schemars(length(min = 8, max = 2048))]
    pub endpoint: String,

    /// How spans travel (`OTEL_EXPORTER_OTLP_PROTOCOL`): `http/protobuf`
    /// (the default) or `grpc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<OtlpProtocol>,

    /// TLS to an https:// collector with a private CA, or one that asks for
    /// a client certificate: the Secrets are mounted into the worker
    /// container and named in `OTEL_EXPORTER_OTLP_CERTIFICATE`,
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `_CLIENT_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TracingTls>,

    /// Headers for every export (`OTEL_EXPORTER_OTLP_HEADERS`,
    /// `key=value,key2=value2`), from a Secret in the pool's namespace: an
    /// API key, for instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_secret_ref: Option<SecretKeyRef>,

    /// The percentage of traces the workers start themselves that are
    /// sampled (jobs without a `traceparent`); a job that has one follows
    /// its producer's decision. Defaults to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub sample_percent: Option<i32>,
}

/// TLS to the collector of `spec.tracing`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracingTls {
    /// A key of a Secret holding the PEM certificate of the CA that signed
    /// the collector's certificate, for a private CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,

    /// A Secret of type `kubernetes.io/tls` (keys `tls.crt` and `tls.key`)
    /// holding the client certificate the workers present to a collector
    /// that asks for one (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret_ref: Option<SecretRef>,
}

/// The OTLP transport of `spec.tracing`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC.
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// Its value in `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

/// How the workers meet node disruption.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("!(has(self.maxUnavailable) && has(self.minAvailable))").message("spec.disruption: set maxUnavailable or minAvailable, not both"))]
#[x_kube(validation = Rule::new("!has(self.maxUnavailable) || string(self.maxUnavailable).matches('^([1-9][0-9]*|([1-9][0-9]?|100)%)$')").message("spec.disruption.maxUnavailable must be at least 1, or a percentage from 1% to 100%: with 0 no worker could ever be evicted and every drain of its node would wait forever"))]
#[serde(rename_all = "camelCase")]
pub struct DisruptionSpec {
    /// While a worker holds a job that has run longer than
    /// `protectAfterSeconds`, the operator marks its pod
    /// `karpenter.sh/do-not-disrupt: "true"` and
    /// `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`, so that
    /// node autoscalers leave its node alone; it removes the marks once the
    /// worker has held no job for `protectAfterSeconds`. `kubectl drain`
    /// and the eviction API do not read these marks: a
    /// PodDisruptionBudget (`maxUnavailable`) paces those. Defaults to
    /// false.
    #[serde(default)]
    pub protect_busy_pods: bool,

    /// How long a job runs before its pod is protected, and how long a
    /// worker is idle before the protection goes. Short jobs never protect
    /// their pods; each pod's marks change at most about once per this
    /// many seconds. Defaults to 60.
    #[serde(default = "sixty")]
    #[schemars(range(min = 0, max = 86400))]
    pub protect_after_seconds: i32,

    /// A PodDisruptionBudget for the pool's pods, owned by the pool: at
    /// most this many workers (or this percentage, rounded up) are evicted
    /// at once, so a drain takes them one batch at a time and each finishes
    /// or gives back its jobs within its grace period. At least 1: a budget
    /// that allows no eviction would block every drain. Pods that run but
    /// are not ready can always be evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // An IntOrString holds an int32: a larger number would pass an
    // unbounded schema and then fail to read (the CEL rule says what is
    // meaningful: at least 1).
    #[schemars(extend("minimum" = i32::MIN, "maximum" = i32::MAX))]
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,

    /// A PodDisruptionBudget that keeps at least this many workers through
    /// evictions. It must be below the fewest workers the pool runs
    /// (`spec.scaling.minReplicas`, or `spec.replicas`), or a drain could
    /// wait forever; a pool that scales to zero uses `maxUnavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_available: Option<i32>,
}

fn sixty() -> i32 {
    60
}

/// A job enqueued on a recurring schedule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.schedule.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|@every [0-9].*|[^@ ]+( +[^ ]+){4}) *$')").message(Message::Expression("'schedule ' + self.name + ': ' + self.schedule + ' is not a schedule: give a cron expression of 5 fields (minute hour day-of-month month day-of-week), @hourly, @daily, @weekly, @monthly, @yearly, or @every with a duration such as @every 30s'".into())))]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// The schedule's name, unique in the pool: a DNS label (lower-case
    /// letters, digits and `-`). Its jobs carry it as `schedule`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,

    /// When to enqueue: a cron expression of 5 fields (minute hour
    /// day-of-month month day-of-week, with `*`, `,`, `-`, `/`, names such as
    /// `MON` and `JAN`, and `L`, `W`, `#`), `@hourly`, `@daily` (or
    /// `@midnight`), `@weekly`, `@monthly`, `@yearly`, or `@every` with a
    /// duration of whole seconds (`@every 30s`, `@every 5m`), which fires at
    /// every multiple of the duration since the Unix epoch.
    #[schemars(length(min = 1, max = 128))]
    pub schedule: String,

    /// The IANA time zone the cron expression is read in, such as
    /// `Europe/Berlin`. Defaults to UTC. On the day clocks go forward, a time
    /// that does not exist (2:30 when 2:00 becomes 3:00) fires at the first
    /// time after the gap (3:00); on the day they go back, a time that
    /// happens twice fires once, the first time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_+\-/]+$"))]
    pub time_zone: Option<String>,

    /// The queue to enqueue on: one of the pool's queues
    /// (`spec.queue.redis.key` or one of `spec.queue.redis.keys`). Defaults
    /// to the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub queue: Option<String>,

    /// The job to enqueue, as a producer would push it: `task`, `data` and
    /// any other field. Each fire's job also gets `schedule` (this
    /// schedule's name), an `id` made of the namespace, the pool, the
    /// schedule and the fire time in unix milliseconds
    /// (`jobs/mail/nightly/1767234600000`), and with `Forbid` a
    /// `unique_key`.
    #[serde(default)]
    #[schemars(schema_with = "job_schema")]
    pub job: serde_json::Map<String, serde_json::Value>,

    /// `Forbid` (the default) skips a fire while the schedule's previous
    /// job is still waiting, delayed, retrying or running; `Allow` always
    /// enqueues.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// A fire missed by more than this many seconds (the operator was not
    /// running) is skipped. Of several missed fires only the latest runs.
    /// Unset: a missed fire runs however late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub starting_deadline_seconds: Option<i64>,

    /// No fires while true: the fires that come meanwhile are skipped, not
    /// run later.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// What a fire does while the schedule's previous job is still in the queue.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum ConcurrencyPolicy {
    /// Skip the fire.
    #[default]
    Forbid,
    /// Enqueue it anyway.
    Allow,
}

fn job_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "The job to enqueue, as a producer would push it: `task`, `data` and any other field. Each fire's job also gets `schedule` (the schedule's name), an `id` made of the namespace, the pool, the schedule and the fire time in unix milliseconds (`jobs/mail/nightly/1767234600000`), and with `Forbid` a `unique_key`.",
    })
}

/// Where the jobs come from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// A Redis list (queue contract v1).
    pub redis: RedisQueue,
}

/// The CEL pattern of a queue name that the queue crate refuses
/// ([`check_name`](workerpool_queue::keys::check_name)): a part after a colon
/// that is one of the words of its other keys ([`KEY_PARTS`]), so that its
/// keys would be another queue's.
fn key_part_pattern() -> String {
    format!(":({})(:|$)", KEY_PARTS.join("|"))
}

/// What a queue name must not hold, in words, and what to do.
fn key_part_advice() -> String {
    let [rest @ .., last] = &KEY_PARTS;
    format!(
        "would be a key of another queue (emails:retry is the retry set of the queue emails): no part of a queue name after a colon may be {} or {last}; rename it, for example with - for :",
        rest.join(", ")
    )
}

/// `spec.queue.redis.key` is no key of another queue.
fn key_part_rule() -> Rule {
    Rule::new(format!(
        "!has(self.key) || !self.key.matches('{}')",
        key_part_pattern()
    ))
    .message(Message::Expression(format!(
        "'spec.queue.redis.key ' + self.key + ' {}'",
        key_part_advice()
    )))
}

/// No name of `spec.queue.redis.keys` is a key of another queue.
fn key_parts_rule() -> Rule {
    Rule::new(format!(
        "!has(self.keys) || self.keys.all(k, !k.matches('{}'))",
        key_part_pattern()
    ))
    .message(Message::Message(format!(
        "spec.queue.redis.keys: a name {}",
        key_part_advice()
    )))
}

/// A queue on Redis.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.url) != has(self.urlSecretRef)").message("set exactly one of spec.queue.redis.url or spec.queue.redis.urlSecretRef"))]
#[x_kube(validation = Rule::new("has(self.key) != has(self.keys)").message("set exactly one of spec.queue.redis.key (one queue) or spec.queue.redis.keys (several, in priority order)"))]
#[x_kube(validation = Rule::new("!has(self.tls) || !has(self.url) || self.url.startsWith('rediss://') || self.url.startsWith('rediss+sentinel://')").message("spec.queue.redis.tls needs a TLS URL: spec.queue.redis.url must start with rediss:// (rediss+sentinel:// through Redis Sentinel)"))]
#[x_kube(validation = Rule::new("!has(self.mode) || self.mode != 'Cluster' || (has(self.key) ? self.key.matches('[{][^}]+[}]') : self.keys.all(k, k.matches('[{][^}]+[}]')))").message("spec.queue.redis.mode is Cluster: queue names need a hash tag so each queue's keys share one slot, for example {mail}, or {mail}:high and {mail}:low for several queues"))]
#[x_kube(validation = Rule::new("!has(self.url) || self.url.matches('^rediss?([+]sentinel)?://')").message("spec.queue.redis.url must start with redis:// (or rediss:// for TLS): redis://[user:password@]host[:port][/db], for example redis://redis:6379/0; through Redis Sentinel redis+sentinel://host1:26379,host2:26379/<primary name>[/<db>] (rediss+sentinel:// for TLS)"))]
#[x_kube(validation = Rule::new("!has(self.url) || !has(self.mode) || self.mode != 'Cluster' || !self.url.matches('^rediss?[+]sentinel://')").message("spec.queue.redis.mode is Cluster but spec.queue.redis.url is a redis+sentinel:// URL, which names a primary and its replicas, not a cluster: set mode to Auto or Standalone"))]
#[x_kube(validation = key_part_rule())]
#[x_kube(validation = key_parts_rule())]
#[serde(rename_all = "camelCase")]
pub struct RedisQueue {
    /// Redis URL, `redis://[user:password@]host[:port][/db]`, `rediss://`
    /// for TLS, or through Redis Sentinel
    /// `redis+sentinel://[[user]:password@]host1:26379[,host2:26379]/<primary name>[/<db>]`
    /// (`rediss+sentinel://` for TLS; `?sentinel_password=…` when the
    /// sentinels have a password of their own). Use `urlSecretRef` when the
    /// URL holds a password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub url: Option<String>,

    /// A key of a Secret in the pool's namespace that holds the Redis URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret_ref: Option<SecretKeyRef>,

    /// The queue: the Redis list producers `LPUSH` jobs onto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub key: Option<String>,

    /// Several queues served in strict priority order, the first first. Their
    /// backlogs add up for scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 256)))]
    pub keys: Option<Vec<String>>,

    /// TLS settings for a `rediss://` (or `rediss+sentinel://`) URL, for
    /// the sentinels and the primary alike: a private CA and a client
    /// certificate from Secrets in the pool's namespace. The operator uses
    /// them for its own reads of the queue and mounts them into the worker
    /// pods. Without this block a `rediss://` URL is verified against the
    /// system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RedisTls>,

    /// One Redis node or a Redis Cluster; see [`RedisMode`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RedisMode>,
}

/// `Auto` (the default) asks the server whether it is a Redis Cluster;
/// `Standalone` or `Cluster` say so. On a cluster the URL names any of its
/// nodes, and queue names need a hash tag so that each queue's keys share
/// one slot: `{mail}`, or `{mail}:high` and `{mail}:low` for several queues
/// (they must share one slot too).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum RedisMode {
    /// Ask the server (`INFO cluster`).
    #[default]
    Auto,
    /// One node.
    Standalone,
    /// A Redis Cluster.
    Cluster,
}

impl From<RedisMode> for workerpool_queue::connection::Mode {
    fn from(m: RedisMode) -> Self {
        match m {
            RedisMode::Auto => Self::Auto,
            RedisMode::Standalone => Self::Standalone,
            RedisMode::Cluster => Self::Cluster,
        }
    }
}

/// TLS to Redis.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisTls {
    /// A key of a Secret holding the PEM certificate of the CA that signed
    /// Redis's certificate, for a private CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,

    /// A Secret of type `kubernetes.io/tls` (keys `tls.crt` and `tls.key`)
    /// holding a client certificate, for a Redis that asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret_ref: Option<SecretRef>,

    /// Accept any certificate from Redis. Only for tests: anyone on the
    /// path can read and change the jobs. Workers log a warning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

/// A Secret in the pool's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
}

impl RedisQueue {
    /// The queues' keys in priority order.
    pub fn queue_keys(&self) -> Vec<workerpool_queue::keys::QueueKeys> {
        self.queue_names()
            .into_iter()
            .map(workerpool_queue::keys::QueueKeys::new)
            .collect()
    }

    /// The queue names in priority order.
    pub fn queue_names(&self) -> Vec<String> {
        match (&self.key, &self.keys) {
            (Some(k), _) => vec![k.clone()],
            (None, Some(keys)) => keys.clone(),
            (None, None) => Vec::new(),
        }
    }
}

/// A key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key within the Secret.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// Settings of each worker process.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.rateLimit) || self.rateLimit.matches('^[1-9][0-9]*/([1-9][0-9]*)?(ms|s|m|h)$')").message("spec.worker.rateLimit must be N/PERIOD: a positive whole number of jobs per unit (ms, s, m, h), optionally after a whole number, such as 20/s, 600/1m or 5/30s"))]
#[x_kube(validation = Rule::new("!has(self.children) || self.children <= (has(self.concurrency) ? self.concurrency : 1)").message("spec.worker.children must be at most spec.worker.concurrency: the slots are spread over the children, each holding at least one. Lower children or raise concurrency"))]
#[serde(rename_all = "camelCase")]
pub struct WorkerSettings {
    /// Jobs each worker runs at once. Defaults to 1.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub concurrency: i32,

    /// How many handler processes share the concurrency's slots (exec
    /// handlers, `--children`): 1 for I/O-bound work whose handler runs
    /// many jobs at once (`async def` tasks on one event loop), the default
    /// one per slot for CPU-bound work. The slots are shared as evenly as
    /// they go, and each process is told its share in
    /// `WORKERPOOL_JOBS_PER_CHILD`; with more than one job at a time it
    /// speaks the multiplexed protocol (the client libraries' `App.run()`
    /// does). At most `concurrency`. Unset: one per slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub children: Option<i32>,

    /// Attempts per job before it is dead-lettered. Defaults to 5.
    #[serde(default = "five")]
    #[schemars(range(min = 1))]
    pub max_attempts: i32,

    /// Seconds one attempt may take before it fails. Defaults to 600.
    #[serde(default = "six_hundred")]
    #[schemars(range(min = 1))]
    pub job_timeout_seconds: i32,

    /// At most this many jobs of each queue start per period, across every
    /// worker of the pool: `20/s`, `600/1m`, `5/30s`, `1000/h`. Jobs over
    /// the limit wait in the queue, not counted as attempts; a burst of a
    /// tenth of the count (at least 1) may start at once after a quiet
    /// spell. The scaling engine never asks for more workers than the
    /// limit keeps busy. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 32))]
    pub rate_limit: Option<String>,

    /// Longest job payload in bytes (`--max-payload-bytes`); a longer one
    /// is dead-lettered whole as `too_large`. Unset: 16 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 536870912))]
    pub max_payload_bytes: Option<i64>,

    /// Seconds the worker keeps every job's outcome (its state, result or
    /// error) in Redis after the job ends (`--keep-outcomes`), for jobs
    /// that do not ask for a time of their own with `keep`; producers read
    /// it with `workerpool job show` or a client's `status` and `wait`. At
    /// most 604800 (a week). Unset: outcomes are kept only for jobs that
    /// ask with their own `keep`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604800))]
    pub keep_outcomes_seconds: Option<i32>,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: one(),
            children: None,
            max_attempts: five(),
            job_timeout_seconds: six_hundred(),
            rate_limit: None,
            max_payload_bytes: None,
            keep_outcomes_seconds: None,
        }
    }
}

/// How workers stop.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownSpec {
    /// The pods' terminationGracePeriodSeconds. On SIGTERM a worker stops
    /// taking jobs, lets running ones finish until a deadline a little
    /// before this, then returns the rest to the head of the queue and
    /// exits. Defaults to 30.
    #[serde(default = "thirty")]
    #[schemars(range(min = 1))]
    pub grace_period_seconds: i32,
}

impl Default for ShutdownSpec {
    fn default() -> Self {
        Self {
            grace_period_seconds: thirty(),
        }
    }
}

fn one() -> i32 {
    1
}
fn five() -> i32 {
    5
}
fn six_hundred() -> i32 {
    600
}
fn thirty() -> i32 {
    30
}

/// What the operator last saw and did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolStatus {
    /// Workers (pods of the Deployment).
    #[serde(default)]
    pub replicas: i32,
    /// Workers ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Workers the operator wants.
    #[serde(default)]
    pub desired_replicas: i32,
    /// Why the pool has this size: the rule that decided and any limit that held it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Jobs waiting, including retries and delayed jobs that are due.
    #[serde(default)]
    pub backlog: i64,
    /// Jobs in workers' processing lists: running, or held by a lost
    /// worker until the reaper returns them to the queue.
    #[serde(default)]
    pub in_flight: i64,
    /// Age in seconds of the oldest waiting job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_job_age_seconds: Option<f64>,
    /// Jobs arriving per second, as the scaling engine smooths it; shown
    /// to three significant digits, and 0 below 0.001. When only the rates
    /// change, the status is written at most every 30 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<f64>,
    /// Jobs completed per second: the measured throughput of one worker
    /// times the ready workers (at least one); shown to three significant
    /// digits, and 0 below 0.001. When only the rates change, the status is
    /// written at most every 30 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<f64>,
    /// Seconds from a scale-up to its new workers being ready, as the
    /// operator measured it (smoothed over scale-ups, to a tenth of a
    /// second). The scaling engine sizes new workers and the idle hold with
    /// it; kept here, it is known again after an operator restart or a
    /// leader change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_startup_seconds: Option<f64>,
    /// When the operator last changed the number of workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// Label selector of the pool's pods (for the scale subresource).
    #[serde(default)]
    pub selector: String,
    /// The spec generation this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `QueueReachable`, `ScalingActive`, `ScalingLimited`, and
    /// `SchedulesValid` for a pool with schedules.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Each schedule's fires, in the order of `spec.schedules`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedules: Option<Vec<ScheduleStatus>>,
    /// Pods the operator marks as not to be disrupted, because their
    /// workers hold long jobs (`spec.disruption.protectBusyPods`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_pods: Option<i32>,
    /// The PodDisruptionBudget the operator keeps for the pool's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<String>,
}

/// The fires of one schedule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// The schedule's name.
    pub name: String,
    /// The fire time of the last job enqueued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire_time: Option<Time>,
    /// The next fire time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_time: Option<Time>,
    /// The fire time of the last fire skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skip_time: Option<Time>,
    /// Why that fire was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skip_reason: Option<String>,
}

/// The PodTemplateSpec schema without descriptions, which would make the
/// CRD too large for client-side `kubectl apply` (the 256 KiB annotation).
fn pod_template_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut value: serde_json::Value = generator.subschema_for::<PodTemplateSpec>().into();
    strip_descriptions(&mut value);
    bound_ports(&mut value);
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "description".into(),
            "The worker pods, as in a Deployment's spec.template (see `kubectl explain deployment.spec.template`).".into(),
        );
    }
    schemars::Schema::try_from(value).expect("a pod template schema is an object")
}

/// Bounds each port of the pod template that may be a number or a name (a
/// probe's or a lifecycle hook's `httpGet.port` and `tcpSocket.port`, the
/// only IntOrString fields of a pod) to 1..=65535, as the Pod's own
/// validation does. Unbounded, a number past an int32 passes the CRD and
/// then cannot be read. Other int-or-string fields of a pod are Quantities
/// (resources, `sizeLimit`, `divisor`), which read any number.
fn bound_ports(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(properties)) = map.get_mut("properties")
                && let Some(serde_json::Value::Object(port)) = properties.get_mut("port")
                && port.get("x-kubernetes-int-or-string") == Some(&serde_json::Value::Bool(true))
            {
                port.entry("minimum").or_insert(1.into());
                port.entry("maximum").or_insert(65535.into());
            }
            map.values_mut().for_each(bound_ports);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(bound_ports),
        _ => {}
    }
}

/// The largest magnitude the schema lets an integer of no narrower format
/// (`int64`) hold: 2^53 - 1. The API server keeps a bound as a float64, in
/// which `i64::MAX` is no number (it rounds up to 2^63, past every int64);
/// up to 2^53 every integer is a float64 exactly, so the bound means what
/// it says, and no field of a pool means anything near it.
pub const LARGEST_INTEGER: i64 = (1 << 53) - 1;

/// The range of integers of the OpenAPI `format`, as the schema bounds them.
pub fn integer_range(format: Option<&str>) -> (i64, i64) {
    match format {
        Some("int8") => (i8::MIN.into(), i8::MAX.into()),
        Some("int16") => (i16::MIN.into(), i16::MAX.into()),
        Some("int32") => (i32::MIN.into(), i32::MAX.into()),
        Some("uint8") => (0, u8::MAX.into()),
        Some("uint16") => (0, u16::MAX.into()),
        Some("uint32") => (0, u32::MAX.into()),
        Some("uint64") => (0, LARGEST_INTEGER),
        _ => (-LARGEST_INTEGER, LARGEST_INTEGER),
    }
}

/// Gives every integer of the schema a `minimum` and a `maximum` within
/// its format's range, where the Rust types left one out (an `i32` field
/// with no `range`, and every integer of the embedded Kubernetes types).
/// The API server takes any integer a field's schema does not bound; one
/// its Rust type cannot hold (`maxReplicas: 2147483648`) would be stored
/// and then fail to read. Bounds already there are kept.
fn bound_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map.get("type").and_then(|t| t.as_str()) == Some("integer") {
                let (min, max) = integer_range(map.get("format").and_then(|f| f.as_str()));
                map.entry("minimum").or_insert(min.into());
                map.entry("maximum").or_insert(max.into());
            }
            map.values_mut().for_each(bound_integers);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

fn strip_descriptions(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("description");
            map.values_mut().for_each(strip_descriptions);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// The CRD as the API server gets it: the Rust types' schema, with each
/// description reflowed into paragraphs (doc comments wrap at 80 columns;
/// `kubectl explain` wraps again, and would break sentences mid-line) and
/// every integer bounded to what its type holds.
pub fn crd() -> CustomResourceDefinition {
    let mut value = serde_json::to_value(WorkerPool::crd()).expect("a CRD always serializes");
    reflow_descriptions(&mut value);
    // The schemas only: a printer column of type integer takes no bounds.
    if let Some(serde_json::Value::Array(versions)) = value.pointer_mut("/spec/versions") {
        for version in versions {
            if let Some(schema) = version.pointer_mut("/schema/openAPIV3Schema") {
                bound_integers(schema);
            }
        }
    }
    serde_json::from_value(value).expect("reflowing keeps the CRD valid")
}

/// The CRD as YAML, as `workerpool-operator crd` prints it and
/// `manifests/crd.yaml` holds it.
pub fn crd_yaml() -> String {
    serde_yaml_ng::to_string(&crd()).expect("a CRD always serializes")
}

fn reflow_descriptions(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    serde_json::Value::String(text) if key == "description" => {
                        *text = reflow(text);
                    }
                    _ => reflow_descriptions(v),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(reflow_descriptions),
        _ => {}
    }
}

/// Joins wrapped lines into paragraphs; blank lines between paragraphs and
/// list items (`- `, `* `, `1. `) keep their line breaks.
pub fn reflow(text: &str) -> String {
    let starts_item = |line: &str| {
        let line = line.trim_start();
        line.starts_with("- ")
            || line.starts_with("* ")
            || line
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    text.split("\n\n")
        .map(|paragraph| {
            let mut out = String::new();
            for line in paragraph.lines() {
                if out.is_empty() {
                    out.push_str(line.trim_end());
                } else if starts_item(line) {
                    out.push('\n');
                    out.push_str(line.trim_end());
                } else {
                    out.push(' ');
                    out.push_str(line.trim());
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(spec: serde_json::Value) -> WorkerPool {
        serde_json::from_value(json!({
            "apiVersion": "workerpool.dev/v1alpha1",
            "kind": "WorkerPool",
            "metadata": {"name": "mail", "namespace": "default"},
            "spec": spec,
        }))
        .expect("a well-typed pool")
    }

    fn template() -> serde_json::Value {
        json!({"spec": {"containers": [{"name": "worker", "image": "example/worker:1"}]}})
    }

    fn cel_errors(spec: serde_json::Value) -> String {
        match pool(spec).validate_cel() {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_checked_in_crd_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/crd.yaml");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        if std::env::var_os("UPDATE_MANIFESTS").is_some() {
            std::fs::write(path, crd_yaml()).expect("write manifests/crd.yaml");
            return;
        }
        assert!(
            on_disk == crd_yaml(),
            "manifests/crd.yaml is stale: run `cargo run -p workerpool-operator -- crd > manifests/crd.yaml`"
        );
    }

    #[test]
    fn descriptions_read_as_paragraphs_with_their_lists_kept() {
        assert_eq!(
            reflow(
                "The fewest workers to run. 0 (the default)\nlets an idle pool scale.\n\nSecond paragraph\nhere.\n- one\n- two\n1. first"
            ),
            "The fewest workers to run. 0 (the default) lets an idle pool scale.\n\nSecond paragraph here.\n- one\n- two\n1. first"
        );
        let crd = serde_json::to_value(crd()).expect("json");
        let scaling = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["scaling"]["properties"];
        let text = scaling["activationBacklog"]["description"]
            .as_str()
            .expect("description");
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("Defaults to 1."), "{text}");
    }

    #[test]
    fn the_crd_has_status_scale_short_name_and_printer_columns() {
        let crd = serde_json::to_value(crd()).expect("json");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["wp"]));
        assert_eq!(version["subresources"]["status"], json!({}));
        assert_eq!(
            version["subresources"]["scale"],
            json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"})
        );
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .expect("columns")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Backlog",
                "In-Flight",
                "Desired",
                "Ready",
                "Status",
                "Reason",
                "Message",
                "Age"
            ]
        );
        // Client-side `kubectl apply` keeps the object as compact JSON in the
        // last-applied-configuration annotation, and all of an object's
        // annotations must fit in 256 KiB; keep to half of that.
        let last_applied = serde_json::to_string(&super::crd()).expect("json");
        assert!(
            last_applied.len() < 131_072,
            "small enough for client-side kubectl apply: {} bytes as compact JSON",
            last_applied.len()
        );
    }

    /// Every node of the CRD's schema that takes a number, with its path:
    /// the integers, and the int-or-string fields.
    fn numeric_nodes() -> Vec<(String, serde_json::Map<String, serde_json::Value>)> {
        fn walk(
            value: &serde_json::Value,
            path: &str,
            found: &mut Vec<(String, serde_json::Map<String, serde_json::Value>)>,
        ) {
            match value {
                serde_json::Value::Object(map) => {
                    if map.get("type") == Some(&json!("integer"))
                        || map.get("x-kubernetes-int-or-string") == Some(&json!(true))
                    {
                        found.push((path.to_string(), map.clone()));
                    }
                    for (key, v) in map {
                        walk(v, &format!("{path}.{key}"), found);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, v) in items.iter().enumerate() {
                        walk(v, &format!("{path}[{i}]"), found);
                    }
                }
                _ => {}
            }
        }
        let crd = serde_json::to_value(crd()).expect("json");
        let mut found = Vec::new();
        walk(
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            "",
            &mut found,
        );
        found
    }

    #[test]
    fn every_integer_in_the_schema_is_bounded_within_what_its_type_holds() {
        let mut integers = 0;
        for (path, node) in numeric_nodes() {
            let bound = |name: &str| node.get(name).and_then(serde_json::Value::as_f64);
            if node.get("type") == Some(&json!("integer")) {
                integers += 1;
                let (lowest, highest) = integer_range(node.get("format").and_then(|f| f.as_str()));
                let (Some(min), Some(max)) = (bound("minimum"), bound("maximum")) else {
                    panic!("{path} is an integer without a minimum and a maximum: {node:?}");
                };
                assert!(
                    lowest as f64 <= min && min <= max && max <= highest as f64,
                    "{path}: {min}..={max} is not within {lowest}..={highest}"
                );
                continue;
            }
            // An int-or-string is an IntOrString (an int32) or a Quantity,
            // which reads any number (it keeps it as text): resources, a
            // volume's sizeLimit, a resource field's divisor, the HPA's
            // tolerance.
            let quantity = ["additionalProperties", "sizeLimit", "divisor", "tolerance"]
                .iter()
                .any(|name| path.ends_with(&format!(".{name}")));
            if quantity {
                continue;
            }
            let (Some(min), Some(max)) = (bound("minimum"), bound("maximum")) else {
                panic!("{path} is an int-or-string without a minimum and a maximum: {node:?}");
            };
            assert!(
                f64::from(i32::MIN) <= min && min <= max && max <= f64::from(i32::MAX),
                "{path}: {min}..={max} is not within an int32"
            );
        }
        // The walk reaches the pod template and the HPA behavior too.
        assert!(integers > 100, "only {integers} integers found");
    }

    #[test]
    fn bounds_are_the_types_own_unless_the_field_has_tighter_ones() {
        let crd = serde_json::to_value(crd()).expect("json");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let bounds = |node: &serde_json::Value| (node["minimum"].clone(), node["maximum"].clone());
        let scaling = &spec["scaling"]["properties"];
        assert_eq!(
            bounds(&scaling["maxReplicas"]),
            (json!(1.0), json!(2147483647.0))
        );
        assert_eq!(
            bounds(
                &scaling["behavior"]["properties"]["scaleUp"]["properties"]["policies"]["items"]["properties"]
                    ["value"]
            ),
            (json!(-2147483648.0), json!(2147483647.0))
        );
        assert_eq!(
            bounds(&spec["worker"]["properties"]["children"]),
            (json!(1.0), json!(2147483647.0))
        );
        assert_eq!(
            bounds(&spec["worker"]["properties"]["keepOutcomesSeconds"]),
            (json!(1.0), json!(604800.0))
        );
        assert_eq!(
            bounds(&spec["tracing"]["properties"]["samplePercent"]),
            (json!(0.0), json!(100.0))
        );
        assert_eq!(
            bounds(&spec["schedules"]["items"]["properties"]["startingDeadlineSeconds"]),
            (json!(0.0), json!(9007199254740991.0))
        );
        assert_eq!(
            bounds(&spec["disruption"]["properties"]["maxUnavailable"]),
            (json!(-2147483648.0), json!(2147483647.0))
        );
        let container = &spec["template"]["properties"]["spec"]["properties"]["containers"]["items"]
            ["properties"];
        assert_eq!(
            bounds(&container["livenessProbe"]["properties"]["httpGet"]["properties"]["port"]),
            (json!(1.0), json!(65535.0))
        );
        assert_eq!(
            bounds(&container["ports"]["items"]["properties"]["containerPort"]),
            (json!(-2147483648.0), json!(2147483647.0))
        );
    }

    #[test]
    fn the_largest_integer_of_each_bound_field_reads_as_its_rust_type() {
        // The top of each bound is a value the pool's types can hold: at
        // the maximum the pool reads, and the API server refuses one more.
        let spec = json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w",
                "ports": [{"containerPort": i32::MAX}],
                "livenessProbe": {"httpGet": {"port": 65535}}}],
                "terminationGracePeriodSeconds": LARGEST_INTEGER}},
            "replicas": i32::MAX,
            "worker": {"concurrency": i32::MAX, "children": i32::MAX, "maxAttempts": i32::MAX, "jobTimeoutSeconds": i32::MAX,
                "keepOutcomesSeconds": 604800},
            "shutdown": {"gracePeriodSeconds": i32::MAX},
            "schedules": [{"name": "a", "schedule": "@hourly", "startingDeadlineSeconds": LARGEST_INTEGER}],
            "disruption": {"maxUnavailable": i32::MAX, "protectAfterSeconds": 86400},
        });
        let p = pool(spec);
        assert_eq!(p.spec.replicas, Some(i32::MAX));
        let scaling = json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": template(),
            "scaling": {"minReplicas": i32::MAX, "maxReplicas": i32::MAX, "pollIntervalSeconds": i32::MAX,
                "targetBacklogPerReplica": i32::MAX, "targetDrainSeconds": i32::MAX,
                "targetWaitSeconds": i32::MAX, "activationBacklog": i32::MAX,
                "idleSecondsBeforeZero": i32::MAX,
                "fallback": {"failureThreshold": i32::MAX, "replicas": i32::MAX},
                "behavior": {"scaleUp": {"stabilizationWindowSeconds": i32::MAX,
                    "policies": [{"type": "Pods", "value": i32::MAX, "periodSeconds": i32::MAX}]}}},
        });
        assert_eq!(
            pool(scaling).spec.scaling.map(|s| s.max_replicas),
            Some(i32::MAX)
        );
        let past = json!({
            "queue": {"redis": {"url": "redis://r", "key": "q"}},
            "template": template(),
            "scaling": {"maxReplicas": i64::from(i32::MAX) + 1},
        });
        let error = serde_json::from_value::<WorkerPoolSpec>(past).expect_err("past an i32");
        assert!(error.to_string().contains("2147483648"), "{error}");
    }

    #[test]
    fn defaults_are_in_the_schema_so_the_api_server_fills_them_in() {
        let crd = serde_json::to_value(crd()).expect("json");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(
            spec["worker"]["properties"]["concurrency"]["default"],
            json!(1)
        );
        assert_eq!(
            spec["shutdown"]["properties"]["gracePeriodSeconds"]["default"],
            json!(30)
        );
        assert_eq!(
            spec["scaling"]["properties"]["maxReplicas"]["default"],
            json!(100)
        );
    }

    #[test]
    fn a_valid_pool_passes_the_cel_rules_and_gets_defaults() {
        let spec = json!({
            "queue": {"redis": {"url": "redis://redis:6379", "key": "mail"}},
            "template": template(),
            "scaling": {"maxReplicas": 10},
        });
        assert_eq!(cel_errors(spec.clone()), "");
        let p = pool(spec);
        assert_eq!(p.spec.worker, WorkerSettings::default());
        for rate in ["20/s", "600/1m", "5/30s", "1000/h", "2/500ms"] {
            let spec = json!({
                "queue": {"redis": {"url": "redis://redis:6379", "key": "mail"}},
                "template": template(),
                "replicas": 1,
                "worker": {"rateLimit": rate},
            });
            assert_eq!(cel_errors(spec), "", "{rate}");
        }
        assert_eq!(p.spec.shutdown.grace_period_seconds, 30);
        assert_eq!(p.spec.scaling.map(|s| s.min_replicas), Some(0));
    }

    #[test]
    fn children_up_to_the_concurrency_pass_and_unset_is_one_per_slot() {
        for children in [1, 3, 50] {
            let spec = json!({
                "queue": {"redis": {"url": "redis://redis:6379", "key": "fetch"}},
                "template": template(),
                "replicas": 1,
                "worker": {"concurrency": 50, "children": children},
            });
            assert_eq!(cel_errors(spec.clone()), "", "{children}");
            assert_eq!(pool(spec).spec.worker.children, Some(children));
        }
        let crd = serde_json::to_value(crd()).expect("json");
        let worker = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["worker"];
        assert!(worker["properties"]["children"].get("default").is_none());
        assert!(
            !worker["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("children")))
        );
        assert_eq!(WorkerSettings::default().children, None);
        assert!(
            serde_json::to_value(WorkerSettings::default())
                .expect("json")
                .get("children")
                .is_none(),
            "unset is left out"
        );
    }

    #[test]
    fn keep_outcomes_up_to_a_week_pass_and_unset_keeps_only_jobs_that_ask() {
        // Checked as local mode checks a manifest: the schema's bounds with
        // the API server's wording, then the CEL rules.
        let check = |worker: serde_json::Value| {
            let manifest = json!({
                "apiVersion": "workerpool.dev/v1alpha1",
                "kind": "WorkerPool",
                "metadata": {"name": "mail"},
                "spec": {
                    "queue": {"redis": {"url": "redis://redis:6379", "key": "mail"}},
                    "template": template(),
                    "replicas": 1,
                    "worker": worker,
                },
            });
            crate::local::manifest::parse(&manifest.to_string(), None)
        };
        for seconds in [1, 3600, 86400, 604800] {
            let pool = check(json!({"keepOutcomesSeconds": seconds}))
                .unwrap_or_else(|e| panic!("{seconds}: {e}"));
            assert_eq!(pool.spec.worker.keep_outcomes_seconds, Some(seconds));
        }
        for (seconds, fix) in [
            (0, "greater than or equal to 1"),
            (604801, "less than or equal to 604800"),
        ] {
            let error = check(json!({"keepOutcomesSeconds": seconds}))
                .err()
                .unwrap_or_else(|| panic!("{seconds} passed"));
            assert!(
                error.contains(&format!(
                    "spec.worker.keepOutcomesSeconds in body should be {fix}"
                )),
                "{seconds}: {error}"
            );
        }
        // The schema's bound is the week the worker allows.
        let crd = serde_json::to_value(crd()).expect("json");
        let worker = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["worker"];
        let field = &worker["properties"]["keepOutcomesSeconds"];
        assert_eq!(
            field["maximum"].as_f64(),
            Some(workerpool_queue::ops::MAX_KEEP.as_secs() as f64)
        );
        assert!(field.get("default").is_none());
        assert!(
            !worker["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("keepOutcomesSeconds")))
        );
        let unset = check(json!({})).expect("valid");
        assert_eq!(unset.spec.worker.keep_outcomes_seconds, None);
        assert_eq!(WorkerSettings::default().keep_outcomes_seconds, None);
        assert!(
            serde_json::to_value(WorkerSettings::default())
                .expect("json")
                .get("keepOutcomesSeconds")
                .is_none(),
            "unset is left out"
        );
    }

    #[test]
    fn schedules_of_every_form_pass_the_cel_rules() {
        let spec = json!({
            "queue": {"redis": {"url": "redis://r", "keys": ["high", "low"]}},
            "template": template(),
            "replicas": 1,
            "schedules": [
                {"name": "nightly", "schedule": "30 2 * * *", "timeZone": "Europe/Berlin",
                 "queue": "low", "job": {"task": "report", "data": {"kind": "nightly"}},
                 "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 600},
                {"name": "spaced", "schedule": "*/5  9-17 * *  MON-FRI"},
                {"name": "hourly", "schedule": "@hourly"},
                {"name": "often", "schedule": "@every 30s", "concurrencyPolicy": "Allow"},
            ],
        });
        assert_eq!(cel_errors(spec.clone()), "");
        let p = pool(spec);
        assert_eq!(p.spec.schedules.len(), 4);
        assert_eq!(
            p.spec.schedules[1].concurrency_policy,
            ConcurrencyPolicy::Forbid
        );
        assert!(p.spec.schedules[0].job.contains_key("task"));
    }

    #[test]
    fn each_cel_rule_refuses_a_bad_spec_with_a_message_that_says_what_to_fix() {
        let redis = json!({"url": "redis://r", "key": "q"});
        for (spec, message) in [
            (
                json!({"queue": {"redis": redis}, "template": template()}),
                "set exactly one of spec.replicas",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 2, "scaling": {}}),
                "set exactly one of spec.replicas",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "scaling": {"minReplicas": 5, "maxReplicas": 2}}),
                "minReplicas must not exceed",
            ),
            (
                json!({"queue": {"redis": {"key": "q"}}, "template": template(), "replicas": 1}),
                "set exactly one of spec.queue.redis.url or spec.queue.redis.urlSecretRef",
            ),
            (
                json!({"queue": {"redis": {"url": "redis://r", "urlSecretRef": {"name": "s", "key": "url"}, "key": "q"}}, "template": template(), "replicas": 1}),
                "set exactly one of spec.queue.redis.url or spec.queue.redis.urlSecretRef",
            ),
            (
                json!({"queue": {"redis": {"url": "redis://r", "key": "q", "keys": ["a"]}}, "template": template(), "replicas": 1}),
                "spec.queue.redis.key (one queue) or spec.queue.redis.keys",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "schedules": [{"name": "a", "schedule": "@hourly"}, {"name": "a", "schedule": "@daily"}]}),
                "spec.schedules: each schedule needs a name of its own",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "schedules": [{"name": "a", "schedule": "@hourly", "queue": "other"}]}),
                "spec.schedules[].queue must be one of the pool's queues",
            ),
            (
                json!({"queue": {"redis": {"url": "redis://r", "keys": ["high", "low"]}}, "template": template(), "replicas": 1,
                       "schedules": [{"name": "a", "schedule": "@hourly", "queue": "other"}]}),
                "spec.schedules[].queue must be one of the pool's queues",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "schedules": [{"name": "nightly", "schedule": "30 2 * *"}]}),
                "schedule nightly: 30 2 * * is not a schedule: give a cron expression of 5 fields",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "schedules": [{"name": "often", "schedule": "@often"}]}),
                "schedule often: @often is not a schedule",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "worker": {"rateLimit": "20/sec"}}),
                "spec.worker.rateLimit must be N/PERIOD",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "worker": {"rateLimit": "0/s"}}),
                "spec.worker.rateLimit must be N/PERIOD",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "worker": {"concurrency": 4, "children": 5}}),
                "spec.worker.children must be at most spec.worker.concurrency",
            ),
            (
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1,
                       "worker": {"children": 2}}),
                "spec.worker.children must be at most spec.worker.concurrency",
            ),
        ] {
            let errors = cel_errors(spec.clone());
            assert!(errors.contains(message), "{spec}: got {errors:?}");
        }
    }

    #[test]
    fn a_disruption_budget_that_could_block_a_drain_forever_is_refused_and_the_rest_pass() {
        let redis = json!({"url": "redis://r", "key": "q"});
        let spec = |sizing: serde_json::Value, disruption: serde_json::Value| {
            let mut spec = json!({"queue": {"redis": redis}, "template": template(), "disruption": disruption});
            for (k, v) in sizing.as_object().expect("sizing") {
                spec[k] = v.clone();
            }
            spec
        };
        let scaled = |min: i32| json!({"scaling": {"minReplicas": min, "maxReplicas": 10}});
        let fixed = |n: i32| json!({"replicas": n});
        for (sizing, disruption) in [
            (scaled(0), json!({"protectBusyPods": true})),
            (scaled(0), json!({"maxUnavailable": 1})),
            (scaled(0), json!({"maxUnavailable": "25%"})),
            (scaled(0), json!({"maxUnavailable": "100%"})),
            (scaled(3), json!({"minAvailable": 2})),
            (
                fixed(4),
                json!({"minAvailable": 3, "protectBusyPods": true, "protectAfterSeconds": 0}),
            ),
        ] {
            let spec = spec(sizing, disruption);
            assert_eq!(cel_errors(spec.clone()), "", "{spec}");
        }
        assert_eq!(
            pool(spec(scaled(0), json!({"protectBusyPods": true})))
                .spec
                .disruption
                .map(|d| d.protect_after_seconds),
            Some(60)
        );
        for (sizing, disruption, message) in [
            (
                scaled(0),
                json!({"maxUnavailable": 0}),
                "maxUnavailable must be at least 1",
            ),
            (
                scaled(0),
                json!({"maxUnavailable": "0%"}),
                "maxUnavailable must be at least 1",
            ),
            (
                scaled(0),
                json!({"maxUnavailable": "150%"}),
                "maxUnavailable must be at least 1",
            ),
            (
                scaled(0),
                json!({"maxUnavailable": "one"}),
                "maxUnavailable must be at least 1",
            ),
            (
                scaled(0),
                json!({"maxUnavailable": 1, "minAvailable": 0}),
                "set maxUnavailable or minAvailable, not both",
            ),
            (
                scaled(0),
                json!({"minAvailable": 0}),
                "minAvailable must be below the fewest workers",
            ),
            (
                scaled(2),
                json!({"minAvailable": 2}),
                "minAvailable must be below the fewest workers",
            ),
            (
                fixed(1),
                json!({"minAvailable": 1}),
                "minAvailable must be below the fewest workers",
            ),
        ] {
            let spec = spec(sizing, disruption);
            let errors = cel_errors(spec.clone());
            assert!(errors.contains(message), "{spec}: got {errors:?}");
        }
    }

    #[test]
    fn a_tracing_endpoint_must_be_an_otlp_http_url() {
        let spec = |endpoint: &str| {
            json!({"queue": {"redis": {"url": "redis://r", "key": "q"}}, "template": template(),
                   "replicas": 1, "tracing": {"endpoint": endpoint}})
        };
        for good in [
            "http://otel-collector.observability:4318",
            "http://10.0.0.5:4318/base",
            "https://otel.example.com",
        ] {
            assert_eq!(cel_errors(spec(good)), "", "{good}");
        }
        for bad in ["grpc://otel:4317", "otel-collector:4318", "http://"] {
            let errors = cel_errors(spec(bad));
            assert!(
                errors.contains("spec.tracing.endpoint must be an http:// or https:// URL"),
                "{bad}: {errors}"
            );
        }
    }

    #[test]
    fn tracing_tls_needs_an_https_endpoint() {
        let spec = |endpoint: &str| {
            json!({"queue": {"redis": {"url": "redis://r", "key": "q"}}, "template": template(),
                   "replicas": 1, "tracing": {"endpoint": endpoint,
                   "tls": {"caSecretRef": {"name": "otel-ca", "key": "ca.crt"}}}})
        };
        assert_eq!(cel_errors(spec("https://otel:4318")), "");
        let errors = cel_errors(spec("http://otel:4318"));
        assert!(
            errors.contains("spec.tracing.tls needs an https:// endpoint"),
            "{errors}"
        );
    }

    #[test]
    fn a_tracing_protocol_is_http_protobuf_or_grpc() {
        let spec = |protocol: &str| {
            json!({"queue": {"redis": {"url": "redis://r", "key": "q"}}, "template": template(),
                   "replicas": 1, "tracing": {"endpoint": "http://otel:4317", "protocol": protocol}})
        };
        for (text, protocol) in [
            ("grpc", OtlpProtocol::Grpc),
            ("http/protobuf", OtlpProtocol::HttpProtobuf),
        ] {
            let pool: WorkerPoolSpec = serde_json::from_value(spec(text)).expect("a valid spec");
            assert_eq!(pool.tracing.and_then(|t| t.protocol), Some(protocol));
            assert_eq!(protocol.as_str(), text);
        }
        let crd = serde_json::to_value(crd()).expect("json");
        let allowed = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["tracing"]["properties"]["protocol"]["enum"];
        assert_eq!(allowed, &json!(["http/protobuf", "grpc"]));
        assert!(serde_json::from_value::<WorkerPoolSpec>(spec("http/json")).is_err());
    }

    #[test]
    fn cel_refuses_exactly_the_queue_names_the_queue_crate_refuses() {
        use workerpool_queue::keys::{KEY_PARTS, check_name};
        let spec = |redis: serde_json::Value| json!({"queue": {"redis": redis}, "template": template(), "replicas": 1});
        let mut names = vec!["mail".to_string(), "retry".into(), "retry:mail".into()];
        for part in KEY_PARTS {
            names.push(format!("mail:{part}"));
            names.push(format!("{{mail}}:high:{part}:x"));
            names.push(format!("mail:{part}s"));
            names.push(format!("mail:x{part}"));
            names.push(part.to_string());
        }
        for name in names {
            let refused = check_name(&name).is_err();
            let one = cel_errors(spec(json!({"url": "redis://r", "key": name})));
            let several = cel_errors(spec(json!({"url": "redis://r", "keys": ["ok", name]})));
            assert_eq!(
                (
                    one.contains("would be a key of another queue"),
                    several.contains("would be a key of another queue")
                ),
                (refused, refused),
                "{name}: {one:?} / {several:?}"
            );
        }
    }

    #[test]
    fn a_sentinel_url_takes_tls_settings_with_its_tls_scheme_and_is_never_a_cluster() {
        let tls = json!({"insecureSkipVerify": true});
        for (redis, refused) in [
            (
                json!({"url": "rediss+sentinel://s1/m", "key": "q", "tls": tls}),
                None,
            ),
            (
                json!({"url": "redis+sentinel://s1/m", "key": "q", "tls": tls}),
                Some("spec.queue.redis.tls needs a TLS URL"),
            ),
            (
                json!({"url": "redis+sentinel://s1/m", "key": "{q}", "mode": "Cluster"}),
                Some(
                    "spec.queue.redis.mode is Cluster but spec.queue.redis.url is a redis+sentinel:// URL",
                ),
            ),
            (
                json!({"url": "redis+sentinel://s1/m", "key": "q", "mode": "Standalone"}),
                None,
            ),
        ] {
            let errors = cel_errors(
                json!({"queue": {"redis": redis}, "template": template(), "replicas": 1}),
            );
            match refused {
                None => assert_eq!(errors, "", "{redis}"),
                Some(message) => assert!(errors.contains(message), "{redis}: {errors}"),
            }
        }
    }

    #[test]
    fn a_redis_url_without_its_scheme_is_refused_at_apply() {
        for (url, refused) in [
            ("10.0.0.69:6379", true),
            ("redis:6379", true),
            ("http://redis:6379", true),
            ("redis://redis:6379/0", false),
            ("rediss://:pw@redis:6380", false),
            ("redis+sentinel://s1:26379,s2:26379/mymaster", false),
            ("rediss+sentinel://:pw@s1:26379/mymaster/2", false),
            ("sentinel://s1:26379", true),
            ("redis+sentinelx://s1:26379/m", true),
        ] {
            let errors = cel_errors(
                json!({"queue": {"redis": {"url": url, "key": "q"}}, "template": template(), "replicas": 1}),
            );
            assert_eq!(
                errors.contains("spec.queue.redis.url must start with redis://"),
                refused,
                "{url}: {errors:?}"
            );
        }
    }
}
