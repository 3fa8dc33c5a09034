//! The controller: one reconcile per WorkerPool every `pollIntervalSeconds`
//! (Redis cannot be watched, so the periodic requeue is the trigger; edits
//! to the pool or its Deployment trigger one too).
//!
//! A reconcile reads the queue in one round trip, asks the scaling engine
//! for a size, marks idle pods cheap to delete before a scale-down, applies
//! the Deployment server-side, and writes status and events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use workerpool_queue::connection::{Connection, Endpoint, Pem, Tls, redact};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::memory::Memory;
use workerpool_queue::snapshot::{self, Snapshot};

use crate::crd::{WorkerPool, WorkerPoolStatus};
use crate::deployment;
use crate::events::{EventType, Note, Recorder};
use crate::metrics::{Metrics, Replicas};
use crate::scaling::{self, Engine, Observation, Verdict};
use crate::workload;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = "workerpool-operator";
/// The annotation the ReplicaSet controller reads to pick pods to delete.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// How long one queue read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// Errors of a reconcile, named after the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the pool's Deployment failed.
    #[error("reading the Deployment: {0}")]
    GetDeployment(#[source] kube::Error),
    /// Applying the pool's Deployment failed.
    #[error("applying the Deployment: {0}")]
    ApplyDeployment(#[source] kube::Error),
    /// Writing the pool's status failed.
    #[error("writing status: {0}")]
    PatchStatus(#[source] kube::Error),
    /// Listing the pool's pods failed.
    #[error("listing pods: {0}")]
    ListPods(#[source] kube::Error),
    /// Setting a pod's deletion cost failed.
    #[error("annotating a pod: {0}")]
    PatchPod(#[source] kube::Error),
    /// The spec cannot be turned into a Deployment.
    #[error("invalid spec: {0}")]
    InvalidSpec(#[source] deployment::BuildError),
}

impl Error {
    /// Static label for metrics (never a Debug string).
    pub fn label(&self) -> &'static str {
        match self {
            Error::GetDeployment(_) => "get_deployment",
            Error::ApplyDeployment(_) => "apply_deployment",
            Error::PatchStatus(_) => "patch_status",
            Error::ListPods(_) => "list_pods",
            Error::PatchPod(_) => "patch_pod",
            Error::InvalidSpec(_) => "invalid_spec",
        }
    }
}

/// Why the queue could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProblem {
    /// CamelCase reason for the condition and event.
    pub reason: &'static str,
    /// What happened and what to fix.
    pub message: String,
}

/// Shared state of all reconciles.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Metrics,
    engines: Mutex<HashMap<String, Engine>>,
    redis: Mutex<HashMap<Endpoint, Connection>>,
    /// Consecutive failed reconciles per pool, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The workload problem last announced with an event, per pool: the
    /// pool's status says it too, but may lag behind a reconcile.
    announced: Mutex<HashMap<String, String>>,
    /// The Deployment last applied per pool: a hash of what was sent and
    /// the generation the API server gave it. While both still hold,
    /// applying it again would change nothing.
    applied: Mutex<HashMap<String, (u64, Option<i64>)>>,
    /// When each pool's status was last written ([`Context::now`]).
    status_written: Mutex<HashMap<String, Duration>>,
    /// The memory settings of each Redis, and when they were read
    /// ([`Context::now`]): read again every [`MEMORY_EVERY`].
    memory: Mutex<HashMap<Endpoint, (Duration, Memory)>>,
    /// The evictions each pool's Redis had counted at the pool's last look.
    evicted_seen: Mutex<HashMap<String, u64>>,
    /// Each pool's dead letters as last seen: the total, and the last rise.
    dead_seen: Mutex<HashMap<String, DeadSeen>>,
    started: Instant,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// A context for `client`, reporting events as `instance`.
    pub fn new(client: Client, metrics: Metrics, instance: Option<String>) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), MANAGER, instance),
            client,
            metrics,
            engines: Mutex::new(HashMap::new()),
            redis: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            announced: Mutex::new(HashMap::new()),
            applied: Mutex::new(HashMap::new()),
            status_written: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
            evicted_seen: Mutex::new(HashMap::new()),
            dead_seen: Mutex::new(HashMap::new()),
            started: Instant::now(),
        }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Forgets a deleted pool's engine state.
    pub fn forget(&self, key: &str) {
        lock(&self.engines).remove(key);
        lock(&self.failures).remove(key);
        lock(&self.announced).remove(key);
        lock(&self.applied).remove(key);
        lock(&self.status_written).remove(key);
        lock(&self.evicted_seen).remove(key);
        lock(&self.dead_seen).remove(key);
        if let Some((namespace, pool)) = key.split_once('/') {
            self.metrics.forget_pool(namespace, pool);
        }
    }

    async fn redis_conn(&self, endpoint: &Endpoint) -> Result<Connection, QueueProblem> {
        if let Some(c) = lock(&self.redis).get(endpoint).cloned() {
            return Ok(c);
        }
        let c = endpoint
            .connect(READ_TIMEOUT, READ_TIMEOUT)
            .await
            .map_err(|e| unreachable_problem(endpoint, &e))?;
        lock(&self.redis).insert(endpoint.clone(), c.clone());
        Ok(c)
    }

    async fn read_queue(
        &self,
        endpoint: &Endpoint,
        queues: &[QueueKeys],
    ) -> Result<Snapshot, QueueProblem> {
        // A pool admitted before the API server checked its names.
        if let Some(problem) = queues
            .iter()
            .find_map(|q| workerpool_queue::keys::check_name(q.name()).err())
        {
            return Err(QueueProblem {
                reason: "InvalidQueueName",
                message: format!("spec.queue.redis: {problem}"),
            });
        }
        let mut c = self.redis_conn(endpoint).await?;
        if c.is_cluster()
            && let Some(problem) = workerpool_queue::keys::cluster_problem(queues)
        {
            return Err(QueueProblem {
                reason: "QueueNamesSpanSlots",
                message: format!("spec.queue.redis: {problem}"),
            });
        }
        match snapshot::read(&mut c, queues).await {
            Ok(s) => Ok(s),
            Err(e) => {
                lock(&self.redis).remove(endpoint);
                Err(unreachable_problem(endpoint, &e))
            }
        }
    }

    /// The memory settings of the Redis that holds `queue`, read at most
    /// every [`MEMORY_EVERY`] per endpoint, and the keys it evicted since
    /// pool `key` last looked. `None` when they cannot be read (a Redis
    /// that refuses `INFO` then shows as a policy that cannot be read).
    async fn memory(
        &self,
        key: &str,
        endpoint: &Endpoint,
        queue: &QueueKeys,
    ) -> Option<(Memory, u64)> {
        let now = self.now();
        let cached = lock(&self.memory)
            .get(endpoint)
            .filter(|(at, _)| now.saturating_sub(*at) < MEMORY_EVERY)
            .map(|(_, m)| m.clone());
        let memory = match cached {
            Some(m) => m,
            None => {
                let mut c = self.redis_conn(endpoint).await.ok()?;
                let m = workerpool_queue::memory::read(&mut c, queue)
                    .await
                    .unwrap_or_default();
                lock(&self.memory).insert(endpoint.clone(), (now, m.clone()));
                m
            }
        };
        let before = lock(&self.evicted_seen).insert(key.to_string(), memory.evicted_keys);
        let evicted = before.map_or(0, |b| memory.evicted_keys.saturating_sub(b));
        Some((memory, evicted))
    }
}

/// How often the operator reads each Redis's eviction policy again.
const MEMORY_EVERY: Duration = Duration::from_secs(60);

/// How long after its last dead letter a pool counts as failing jobs.
const FAILING_FOR: Duration = Duration::from_secs(300);

/// A pool's dead letters as the operator last saw them.
#[derive(Debug, Clone, Default)]
struct DeadSeen {
    /// The dead-lettered total over the pool's queues.
    total: u64,
    /// When it last rose ([`Context::now`]), by how much over the window,
    /// and the newest dead letter's reason and error.
    rise: Option<(Duration, u64, String)>,
}

/// Jobs of a pool dead-lettered lately, for the `JobsFailing` condition.
#[derive(Debug, Clone, PartialEq)]
struct Failing {
    /// Dead-lettered within the window.
    count: u64,
    /// The newest dead letter: its reason and error, escaped and bounded.
    latest: String,
}

impl Context {
    /// Compares the pool's dead-lettered total with the last look. On a
    /// rise, reads the newest dead letter of a queue that rose. On the
    /// first look (a new pool, a restarted operator), judges by the dead
    /// letters' own times instead, so that jobs which died before the
    /// operator looked still show. Returns the jobs dead-lettered within
    /// [`FAILING_FOR`] of the last rise.
    async fn failing(&self, key: &str, endpoint: &Endpoint, snap: &Snapshot) -> Option<Failing> {
        let total: u64 = snap.queues.iter().map(|q| q.dead_total).sum();
        let now = self.now();
        let before = lock(&self.dead_seen).get(key).cloned();
        let mut seen = before.clone().unwrap_or_default();
        seen.total = total;
        match &before {
            Some(before) if total > before.total => {
                let latest = self
                    .latest_dead(endpoint, snap)
                    .await
                    .map(|(_, text)| text)
                    .unwrap_or_default();
                let within = seen
                    .rise
                    .as_ref()
                    .filter(|(at, _, _)| now.saturating_sub(*at) < FAILING_FOR)
                    .map_or(0, |(_, n, _)| *n);
                seen.rise = Some((now, within + (total - before.total), latest));
            }
            Some(_) => {}
            None => {
                if let Some((recent, latest)) = self.latest_dead(endpoint, snap).await
                    && let Some(age) = recent.newest_age(snap.server_time_ms)
                    && age < FAILING_FOR
                {
                    seen.rise = Some((now.saturating_sub(age), recent.count, latest));
                }
            }
        }
        let failing = seen
            .rise
            .as_ref()
            .filter(|(at, _, _)| now.saturating_sub(*at) < FAILING_FOR)
            .map(|(_, count, latest)| Failing {
                count: *count,
                latest: latest.clone(),
            });
        lock(&self.dead_seen).insert(key.to_string(), seen);
        failing
    }

    /// The newest dead letters of the pool's queues (a few per queue): how
    /// many died within [`FAILING_FOR`], when the newest died, and its
    /// reason and error.
    async fn latest_dead(&self, endpoint: &Endpoint, snap: &Snapshot) -> Option<(Recent, String)> {
        let mut c = self.redis_conn(endpoint).await.ok()?;
        let mut recent = Recent::default();
        let mut latest: Option<(u64, String)> = None;
        for q in snap.queues.iter().filter(|q| q.dead > 0) {
            let keys = QueueKeys::new(q.name.clone());
            let Ok(entries) =
                workerpool_queue::admin::dead_letters(&mut c, &keys, None, Some(RECENT_READ)).await
            else {
                continue;
            };
            for letter in entries.into_iter().filter_map(|e| e.letter) {
                let age = snap.server_time_ms.saturating_sub(letter.died_at);
                if u128::from(age) < FAILING_FOR.as_millis() {
                    recent.count += 1;
                }
                recent.newest_ms = recent.newest_ms.max(letter.died_at);
                if latest.as_ref().is_none_or(|(at, _)| letter.died_at > *at) {
                    let text = workerpool_queue::text::safe_line(
                        &format!("{}: {}", letter.reason.as_str(), letter.error),
                        300,
                    );
                    latest = Some((letter.died_at, text));
                }
            }
        }
        let (_, text) = latest?;
        Some((recent, text))
    }
}

/// How many of each queue's newest dead letters a first look reads.
const RECENT_READ: usize = 20;

/// The newest dead letters as a first look found them.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    /// Dead-lettered within [`FAILING_FOR`] (of those read).
    count: u64,
    /// When the newest died, unix ms (Redis clock; 0: unknown).
    newest_ms: u64,
}

impl Recent {
    /// How long ago the newest died, at `server_time_ms`.
    fn newest_age(&self, server_time_ms: u64) -> Option<Duration> {
        (self.newest_ms > 0)
            .then(|| Duration::from_millis(server_time_ms.saturating_sub(self.newest_ms)))
    }
}

/// A failed read of the queue, naming where it was read (the password
/// masked), as the CLI does. A command or key the Redis ACL refuses is
/// `RedisPermissionDenied`, naming the command.
fn unreachable_problem(endpoint: &Endpoint, e: &redis::RedisError) -> QueueProblem {
    QueueProblem {
        reason: if workerpool_queue::connection::refused(e).is_some() {
            "RedisPermissionDenied"
        } else {
            "RedisUnreachable"
        },
        message: format!(
            "cannot read the queue at {}: {}",
            endpoint.redacted(),
            endpoint.describe(e)
        ),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the pool's Redis is and how to reach it: the URL from the spec or
/// its Secret, and the TLS material from the Secrets `spec.queue.redis.tls`
/// names.
async fn redis_endpoint(pool: &WorkerPool, client: &Client) -> Result<Endpoint, QueueProblem> {
    let redis = &pool.spec.queue.redis;
    let url = match (&redis.url, &redis.url_secret_ref) {
        (Some(url), _) => url.clone(),
        (None, Some(r)) => {
            let bytes = secret_value(
                pool,
                client,
                &r.name,
                &r.key,
                "spec.queue.redis.urlSecretRef",
            )
            .await?;
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        (None, None) => {
            return Err(QueueProblem {
                reason: "InvalidSpec",
                message: "set spec.queue.redis.url or spec.queue.redis.urlSecretRef".into(),
            });
        }
    };
    let tls = redis.tls.clone().unwrap_or_default();
    let options = Tls {
        insecure_skip_verify: tls.insecure_skip_verify,
        ..Tls::default()
    };
    if redis.tls.is_some()
        && !url.starts_with("rediss://")
        && !url.starts_with("rediss+sentinel://")
    {
        return Err(QueueProblem {
            reason: "InvalidRedisURL",
            message: format!(
                "spec.queue.redis.tls is set but the Redis URL {} is plain redis://; use rediss:// (rediss+sentinel:// for Redis Sentinel)",
                redact(&url)
            ),
        });
    }
    let endpoint = Endpoint::new(url, options)
        .and_then(|e| e.with_mode(redis.mode.unwrap_or_default().into()))
        .map_err(|e| QueueProblem {
            reason: "InvalidRedisURL",
            message: format!("spec.queue.redis: {e}"),
        })?;
    let mut pem = Pem::default();
    if let Some(r) = &tls.ca_secret_ref {
        pem.ca = Some(
            secret_value(
                pool,
                client,
                &r.name,
                &r.key,
                "spec.queue.redis.tls.caSecretRef",
            )
            .await?,
        );
    }
    if let Some(r) = &tls.client_certificate_secret_ref {
        let what = "spec.queue.redis.tls.clientCertificateSecretRef";
        let cert = secret_value(pool, client, &r.name, "tls.crt", what).await?;
        let key = secret_value(pool, client, &r.name, "tls.key", what).await?;
        pem.client = Some((cert, key));
    }
    Ok(if pem == Pem::default() {
        endpoint
    } else {
        endpoint.with_pem(pem)
    })
}

/// A key of a Secret in the pool's namespace, named in the spec at `what`.
async fn secret_value(
    pool: &WorkerPool,
    client: &Client,
    name: &str,
    key: &str,
    what: &str,
) -> Result<Vec<u8>, QueueProblem> {
    let namespace = pool.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets.get_opt(name).await.map_err(|e| QueueProblem {
        reason: "SecretUnreadable",
        message: format!("cannot read Secret {name:?}: {e}"),
    })?;
    let Some(secret) = secret else {
        return Err(QueueProblem {
            reason: "SecretNotFound",
            message: format!(
                "Secret {name:?} named in {what} does not exist in namespace {namespace:?}"
            ),
        });
    };
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .ok_or_else(|| QueueProblem {
            reason: "SecretKeyNotFound",
            message: format!("Secret {name:?} named in {what} has no key {key:?}"),
        })
}

/// Reconciles one WorkerPool.
pub async fn reconcile(pool: Arc<WorkerPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&pool, &ctx).await;
    ctx.metrics
        .observe_reconcile(started.elapsed(), result.as_ref().err().map(Error::label));
    if result.is_ok() {
        lock(&ctx.failures).remove(&pool_key(&pool));
    }
    result
}

fn pool_key(pool: &WorkerPool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// Delay before retrying a pool whose reconcile failed `failures` times in
/// a row: 5 s doubling to 5 minutes.
pub fn retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    Duration::from_secs(5 << doublings).min(Duration::from_secs(300))
}

/// What one reconcile read: the Deployment, the pods (only while workers
/// are missing or about to be removed), and the queue.
struct Observed {
    existing: Option<Deployment>,
    pods: Option<Vec<Pod>>,
    reading: Result<Snapshot, QueueProblem>,
    /// The eviction policy of the queue's Redis and the keys it evicted
    /// since the pool's last look (`None`: not read).
    memory: Option<(Memory, u64)>,
    /// Jobs dead-lettered lately (`None`: none, or the queue not read).
    failing: Option<Failing>,
    counts: Counts,
    fires: schedules::Fires,
}

/// What one reconcile does, decided without I/O from what it observed.
#[derive(Debug)]
struct Plan {
    /// The Deployment to apply.
    deployment: Deployment,
    /// Mark idle pods cheapest to delete before the apply (a scale-down).
    mark_idle: bool,
    /// The replica change the apply makes (from, to), if any: the engine
    /// records it only once the API server has taken the Deployment.
    scale: Option<(i32, i32)>,
    /// Why the pool has its size, for the log of a scale.
    scale_note: String,
    /// Events to record: type, reason, note.
    events: Vec<(EventType, String, String)>,
    /// The workload problem to remember as announced (None: forget it).
    announced: Option<String>,
    /// The status to write.
    status: WorkerPoolStatus,
    /// When to look again.
    requeue: Duration,
}

async fn reconcile_inner(pool: &WorkerPool, ctx: &Context) -> Result<Action, Error> {
    let key = pool_key(pool);
    let observed = observe(pool, ctx).await?;
    let decided_at = ctx.now();
    let verdict = scaling::decide(
        lock(&ctx.engines)
            .entry(key.clone())
            .or_default()
            .with_workers(scaling::Workers::new(
                pool.spec.worker.rate_limit.as_deref(),
                pool.spec.worker.concurrency,
            )),
        pool.spec.scaling.as_ref(),
        pool.spec.replicas,
        observed
            .reading
            .as_ref()
            .ok()
            .map(|snap| {
                Observation::from_counts(
                    &snap.counts(),
                    observed.counts.current,
                    observed.counts.ready,
                )
            })
            .as_ref(),
        observed.counts.current,
        decided_at,
    );
    let announced = lock(&ctx.announced).get(&key).cloned();
    let plan = plan(pool, &observed, &verdict, announced.as_deref())?;
    apply(pool, ctx, observed, plan, decided_at).await
}

/// A hash of what an apply sends; `None` when it does not serialize (it
/// is then applied on every look, and the apply reports why it fails).
fn fingerprint(deployment: &Deployment) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let text = serde_json::to_string(deployment).ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    Some(hasher.finish())
}

/// Whether `live` still has the labels, annotations and owners of
/// `sent`: edits of its metadata do not move its generation.
fn metadata_holds(sent: &Deployment, live: &Deployment) -> bool {
    let subset = |want: &Option<std::collections::BTreeMap<String, String>>,
                  have: &Option<std::collections::BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    let (want, have) = (&sent.metadata, &live.metadata);
    subset(&want.labels, &have.labels)
        && subset(&want.annotations, &have.annotations)
        && want.owner_references.iter().flatten().all(|owner| {
            have.owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == owner.uid && o.controller == owner.controller)
        })
}

/// Reads the Deployment, the pods when workers are missing, and the queue.
async fn observe(pool: &WorkerPool, ctx: &Context) -> Result<Observed, Error> {
    let deployments: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let existing = deployments
        .get_opt(&pool.name_any())
        .await
        .map_err(Error::GetDeployment)?;
    let status = existing.as_ref().and_then(|d| d.status.as_ref());
    let current = existing
        .as_ref()
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(0);
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let replicas = status.and_then(|s| s.replicas).unwrap_or(0);
    // Workers missing: the pods say why (an image that cannot be pulled, a
    // crash loop), beside the Deployment (pods refused).
    let pods = if existing.is_some() && ready < current {
        Some(list_pods(pool, ctx).await?)
    } else {
        None
    };
    let queues = pool.spec.queue.redis.queue_keys();
    let (reading, memory, fires) = match redis_endpoint(pool, &ctx.client).await {
        Ok(endpoint) => {
            // Fires first, so that a pool at zero wakes for its job now.
            let fires = schedules::fire(pool, ctx, Some(&endpoint)).await;
            let reading = ctx.read_queue(&endpoint, &queues).await;
            let memory = match (&reading, queues.first()) {
                (Ok(_), Some(q)) => ctx.memory(&pool_key(pool), &endpoint, q).await,
                _ => None,
            };
            let failing = match &reading {
                Ok(snap) => ctx.failing(&pool_key(pool), &endpoint, snap).await,
                Err(_) => None,
            };
            (reading, (memory, failing), fires)
        }
        Err(problem) => (
            Err(problem),
            (None, None),
            schedules::fire(pool, ctx, None).await,
        ),
    };
    let (memory, failing) = memory;
    Ok(Observed {
        existing,
        pods,
        reading,
        memory,
        failing,
        fires,
        counts: Counts {
            desired: 0,
            replicas,
            ready,
            current,
        },
    })
}

/// Everything a reconcile does, decided from what it observed: pure.
fn plan(
    pool: &WorkerPool,
    observed: &Observed,
    verdict: &Verdict,
    announced: Option<&str>,
) -> Result<Plan, Error> {
    let Counts { current, ready, .. } = observed.counts;
    let desired = verdict.desired;
    let counts = Counts {
        desired,
        ..observed.counts
    };
    // Pods the cluster refuses first, then handlers that cannot run (the
    // workers' heartbeats say so even when the ready count looks fine).
    let problem = if ready < current {
        workload::problem(
            observed.existing.as_ref(),
            observed.pods.as_deref().unwrap_or_default(),
        )
    } else {
        None
    }
    .or_else(|| workload::handler_problem(observed.reading.as_ref().ok()?));
    let deployment = deployment::build(pool, desired).map_err(Error::InvalidSpec)?;
    let mut events = Vec::new();
    if desired != current && observed.existing.is_some() {
        let (reason, verb) = if desired > current {
            ("ScaledUp", "up")
        } else {
            ("ScaledDown", "down")
        };
        let note = format!(
            "scaled {verb} from {current} to {desired}: {}",
            verdict.message()
        );
        events.push((EventType::Normal, reason.to_string(), note));
    }
    if let Err(problem) = &observed.reading {
        events.push((
            EventType::Warning,
            problem.reason.to_string(),
            problem.message.clone(),
        ));
    }
    // An evicting Redis: once when it is first seen (or its policy
    // changes), and whenever it has evicted keys since the last look.
    if let Some((memory, evicted)) = &observed.memory {
        let said = condition_of(pool, "QueueSafe")
            .is_some_and(|c| c.status == "False" && c.reason == memory.reason());
        if let Some(warning) = memory.warning()
            && !said
        {
            events.push((EventType::Warning, memory.reason().to_string(), warning));
        }
        if *evicted > 0 {
            events.push((
                EventType::Warning,
                "KeysEvicted".to_string(),
                evicted_note(memory, *evicted),
            ));
        }
    }
    // One event when the workers start failing for a reason, not one per
    // poll: the status may lag a reconcile behind, the memory does not.
    if let Some(p) = &problem
        && ready_reason(pool) != Some(p.reason.as_str())
        && announced != Some(p.reason.as_str())
    {
        events.push((EventType::Warning, p.reason.clone(), p.message.clone()));
    }
    if let Some(f) = &observed.failing
        && condition_of(pool, "JobsFailing").is_none_or(|c| c.status != "True")
    {
        events.push((
            EventType::Warning,
            "JobsFailing".to_string(),
            failing_note(f),
        ));
    }
    let mut status = status(
        pool,
        counts,
        &observed.reading,
        observed.memory.as_ref().map(|(m, _)| m),
        observed.failing.as_ref(),
        verdict,
        problem.as_ref(),
    );
    let poll = pool
        .spec
        .scaling
        .as_ref()
        .map_or(30, |s| s.poll_interval_seconds.max(1));
    let requeue = observed.fires.fold(
        pool,
        &mut status,
        &mut events,
        Duration::from_secs(poll as u64),
    );
    Ok(Plan {
        deployment,
        mark_idle: observed.reading.is_ok() && desired < current,
        scale: (desired != current).then_some((current, desired)),
        scale_note: verdict.message(),
        events,
        announced: problem.map(|p| p.reason),
        status,
        requeue,
    })
}

/// Carries out a plan: deletion costs, the Deployment, events, status.
async fn apply(
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

async fn publish(
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

/// Logs each problem the conditions show once as it starts and once as it
/// clears, not on every look.
fn log_transitions(pool: &str, old: Option<&WorkerPoolStatus>, new: &WorkerPoolStatus) {
    for (type_, started) in transitions(old, new) {
        let Some(c) = new.conditions.iter().find(|c| c.type_ == type_) else {
            continue;
        };
        if started {
            tracing::warn!(pool, condition = %c.type_, reason = %c.reason, "{}", c.message);
        } else {
            tracing::info!(pool, condition = %c.type_, reason = %c.reason, "cleared: {}", c.message);
        }
    }
}

/// The conditions whose problem started (`true`) or cleared (`false`)
/// between `old` and `new`: the conditions are the memory of what was
/// said. `Ready` waiting for workers to start is no problem.
fn transitions(old: Option<&WorkerPoolStatus>, new: &WorkerPoolStatus) -> Vec<(String, bool)> {
    const WATCHED: [&str; 5] = [
        "QueueReachable",
        "QueueSafe",
        "JobsFailing",
        "Ready",
        "SchedulesValid",
    ];
    // JobsFailing says its problem with True; the others with False.
    let problem = |c: &Condition| {
        if c.type_ == "JobsFailing" {
            c.status == "True"
        } else {
            c.status == "False" && c.reason != "WorkersStarting"
        }
    };
    let mut changes = Vec::new();
    for c in new
        .conditions
        .iter()
        .filter(|c| WATCHED.contains(&c.type_.as_str()))
    {
        let before = old.and_then(|o| o.conditions.iter().find(|o| o.type_ == c.type_));
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        if problem(c) {
            changes.push((c.type_.clone(), true));
        } else if before.is_some_and(problem) {
            changes.push((c.type_.clone(), false));
        }
    }
    changes
}

/// The pool's condition `type_` as last written.
fn condition_of<'a>(pool: &'a WorkerPool, type_: &str) -> Option<&'a Condition> {
    pool.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// What the `JobsFailing` condition and event say.
fn failing_note(f: &Failing) -> String {
    let latest = if f.latest.is_empty() {
        String::new()
    } else {
        format!("; the newest: {}", f.latest)
    };
    format!(
        "{} job{} dead-lettered in the last {} minutes{latest}; see them with `workerpool dead list`",
        f.count,
        if f.count == 1 { "" } else { "s" },
        FAILING_FOR.as_secs() / 60
    )
}

/// The note of a `KeysEvicted` event.
fn evicted_note(memory: &Memory, evicted: u64) -> String {
    let policy = memory.policy.as_deref().unwrap_or("unknown");
    let what = match memory.risk() {
        workerpool_queue::memory::Risk::Volatile => {
            "only keys with a TTL can go (a worker's details, a rate bucket)"
        }
        _ => "jobs of this pool's queues may be among them",
    };
    format!(
        "Redis evicted {evicted} keys since the last look (maxmemory-policy {policy}): {what}; \
         set maxmemory-policy noeviction, or give Redis more memory"
    )
}

/// The reason of the pool's `Ready` condition as last written.
fn ready_reason(pool: &WorkerPool) -> Option<&str> {
    pool.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str())
}

/// The pool's pods.
async fn list_pods(pool: &WorkerPool, ctx: &Context) -> Result<Vec<Pod>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let list = pods
        .list(&ListParams::default().labels(&deployment::selector(&pool.name_any())))
        .await
        .map_err(Error::ListPods)?;
    Ok(list.items)
}

/// Before a scale-down, sets each pod's deletion cost to its worker's
/// in-flight jobs, so the ReplicaSet removes idle workers first.
async fn mark_idle_pods(
    pool: &WorkerPool,
    ctx: &Context,
    snap: &Snapshot,
    list: Vec<Pod>,
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let busy = snap.in_flight_by_worker_id();
    for pod in list {
        let name = pod.name_any();
        let cost = busy.get(&name).copied().unwrap_or(0).to_string();
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

/// Worker counts of one reconcile.
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// What the pool should have now.
    desired: i32,
    /// Pods the Deployment has.
    replicas: i32,
    /// Pods ready.
    ready: i32,
    /// The Deployment's replicas before this reconcile.
    current: i32,
}

/// How often a status that differs from the one written only in its rates
/// (`arrivalRate`, `throughput`) is written: after a burst the smoothed
/// rates decay for minutes, and a write on every look at every pool would
/// load the API server for figures that move on anyway.
const RATES_WRITTEN_EVERY: Duration = Duration::from_secs(30);

/// Whether to write the status `new` over `old`, the status this operator
/// last wrote at `written` (`None`: not since it started), at `now`. An
/// unchanged status is not written again: for an idle pool that is every
/// look but the first. A change of its rates alone waits for
/// [`RATES_WRITTEN_EVERY`]; any other change is written at once.
fn status_write(
    old: Option<&WorkerPoolStatus>,
    new: &WorkerPoolStatus,
    written: Option<Duration>,
    now: Duration,
) -> bool {
    let Some(old) = old else {
        return true;
    };
    if old == new {
        return false;
    }
    let rates_only = *new
        == WorkerPoolStatus {
            arrival_rate: new.arrival_rate,
            throughput: new.throughput,
            ..old.clone()
        };
    !rates_only || written.is_none_or(|at| now.saturating_sub(at) >= RATES_WRITTEN_EVERY)
}

/// The merge patch that makes the status `new` where it was `old`. A
/// field that `new` leaves out (an optional one that is `None`) is sent as
/// `null`, which removes it: left out of a merge patch, the old value would
/// stay (an oldest job's age shown after the queue drained).
fn status_patch(old: Option<&WorkerPoolStatus>, new: &WorkerPoolStatus) -> serde_json::Value {
    let mut fields = match serde_json::to_value(new) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    if let Some(serde_json::Value::Object(old)) = old.and_then(|o| serde_json::to_value(o).ok()) {
        for name in old.keys() {
            fields
                .entry(name.clone())
                .or_insert(serde_json::Value::Null);
        }
    }
    json!({ "status": fields })
}

/// A rate as the status shows it: three significant digits, and none below
/// one job in a thousand seconds. The smoothed rates decay towards zero
/// without reaching it; shown in full they would change the status, and so
/// cost a write, on every look at a pool long idle.
fn shown_rate(rate: f64) -> f64 {
    if !rate.is_finite() || rate.abs() < 0.001 {
        return 0.0;
    }
    let scale = 10f64.powi(2 - rate.abs().log10().floor() as i32);
    (rate * scale).round() / scale
}

fn status(
    pool: &WorkerPool,
    counts: Counts,
    reading: &Result<Snapshot, QueueProblem>,
    memory: Option<&Memory>,
    failing: Option<&Failing>,
    verdict: &Verdict,
    problem: Option<&workload::Problem>,
) -> WorkerPoolStatus {
    let Counts {
        desired,
        replicas,
        ready,
        current,
    } = counts;
    let old = pool.status.clone().unwrap_or_default();
    let generation = pool.meta().generation;
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let previous = old.conditions.iter().find(|c| c.type_ == type_);
        let since = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Time(k8s_openapi::jiff::Timestamp::now()),
        };
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: since,
            observed_generation: generation,
        }
    };
    let mut conditions = Vec::new();
    let (backlog, in_flight, oldest) = match reading {
        Ok(s) => {
            conditions.push(condition(
                "QueueReachable",
                true,
                "QueueRead",
                format!("read {} queue(s)", s.queues.len()),
            ));
            let c = s.counts();
            (
                c.backlog() as i64,
                c.held() as i64,
                c.oldest_job_age_seconds(),
            )
        }
        Err(p) => {
            conditions.push(condition(
                "QueueReachable",
                false,
                p.reason,
                p.message.clone(),
            ));
            (old.backlog, old.in_flight, old.oldest_job_age_seconds)
        }
    };
    // Whether Redis may delete the queue's keys to make room; kept as last
    // read while it cannot be read.
    match memory {
        Some(m) => conditions.push(condition(
            "QueueSafe",
            m.warning().is_none(),
            m.reason(),
            m.warning().unwrap_or_else(|| {
                "Redis does not evict keys (maxmemory-policy noeviction)".into()
            }),
        )),
        None => conditions.extend(
            old.conditions
                .iter()
                .find(|c| c.type_ == "QueueSafe")
                .cloned(),
        ),
    }
    // Dead letters lately: kept as last read while the queue cannot be read.
    match (reading, failing) {
        (Ok(_), Some(f)) => conditions.push(condition(
            "JobsFailing",
            true,
            "DeadLettered",
            failing_note(f),
        )),
        (Ok(_), None) => conditions.push(condition(
            "JobsFailing",
            false,
            "NoDeadLetters",
            format!(
                "no job dead-lettered in the last {} minutes",
                FAILING_FOR.as_secs() / 60
            ),
        )),
        (Err(_), _) => conditions.extend(
            old.conditions
                .iter()
                .find(|c| c.type_ == "JobsFailing")
                .cloned(),
        ),
    }
    let decision = verdict.decision.as_ref();
    match decision {
        Some(d) => {
            conditions.push(condition(
                "ScalingActive",
                reading.is_ok(),
                d.reason.rule.code(),
                d.reason.message(),
            ));
            conditions.push(condition(
                "ScalingLimited",
                d.reason.limit.is_some(),
                d.reason.limit.map_or("WithinLimits", |l| l.code()),
                d.reason.message(),
            ));
        }
        None => conditions.push(condition(
            "ScalingActive",
            false,
            verdict.code(),
            verdict.message(),
        )),
    }
    // Ready, which the Status column shows, names the most important
    // problem first: a queue that cannot be read (the pool can neither run
    // nor size its workers), then workers the cluster refuses, and only
    // then how many are ready.
    let ready_ok = ready >= desired;
    let counted = format!("{ready} of {desired} workers ready");
    conditions.push(match (reading, problem) {
        (Err(q), _) => condition(
            "Ready",
            false,
            q.reason,
            format!("{counted}; {}", q.message),
        ),
        (Ok(_), Some(p)) if !ready_ok || p.reason == workload::HANDLER_FAILING => condition(
            "Ready",
            false,
            &p.reason,
            format!("{counted}: {}", p.message),
        ),
        (Ok(_), _) if failing.is_some() => condition(
            "Ready",
            false,
            "JobsFailing",
            format!(
                "{counted}; {}",
                failing.map(failing_note).unwrap_or_default()
            ),
        ),
        _ if ready_ok => condition("Ready", true, "WorkersReady", counted),
        _ => condition("Ready", false, "WorkersStarting", counted),
    });
    WorkerPoolStatus {
        replicas,
        ready_replicas: ready,
        desired_replicas: desired,
        reason: decision.map(|d| d.reason.code().to_string()),
        backlog,
        in_flight,
        oldest_job_age_seconds: oldest,
        arrival_rate: decision.and_then(|d| d.arrival_rate).map(shown_rate),
        throughput: decision.and_then(|d| {
            d.per_replica_throughput
                .map(|t| shown_rate(t * f64::from(ready.max(1))))
        }),
        last_scale_time: if desired != current {
            Some(Time(k8s_openapi::jiff::Timestamp::now()))
        } else {
            old.last_scale_time
        },
        selector: deployment::selector(&pool.name_any()),
        observed_generation: generation,
        conditions,
        schedules: old.schedules,
    }
}

/// What to do after a failed reconcile: log, count, retry soon.
pub fn error_policy(pool: Arc<WorkerPool>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), error = %error, "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.label()])
        .inc();
    let failures = {
        let mut all = lock(&ctx.failures);
        let n = all.entry(pool_key(&pool)).or_default();
        *n = n.saturating_add(1);
        *n
    };
    Action::requeue(retry_delay(failures))
}

mod schedules;

#[cfg(test)]
mod tests;
