//! What a reconcile reads: the Deployment, the pods while workers are
//! missing, the queue, the Redis memory settings and the dead letters.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::Api;
use workerpool_queue::connection::Endpoint;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::memory::Memory;
use workerpool_queue::snapshot::{self, Snapshot};

use super::endpoint::unreachable_problem;
use super::pods::list_pods;
use super::{Context, Error, QueueProblem, lock, pool_key};
use crate::crd::WorkerPool;
use crate::disruption;
use crate::workload;

impl Context {
    pub(super) async fn read_queue(
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
    pub(super) async fn memory(
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
        let before = self.pool(key, |m| m.evicted_seen.replace(memory.evicted_keys));
        let evicted = before.map_or(0, |b| memory.evicted_keys.saturating_sub(b));
        Some((memory, evicted))
    }
}

/// How often the operator reads each Redis's eviction policy again.
pub(super) const MEMORY_EVERY: Duration = Duration::from_secs(60);

/// How long after its last dead letter a pool counts as failing jobs.
pub(super) const FAILING_FOR: Duration = Duration::from_secs(300);

/// A pool's dead letters as the operator last saw them.
#[derive(Debug, Clone, Default)]
pub(super) struct DeadSeen {
    /// The dead-lettered total over the pool's queues.
    pub(super) total: u64,
    /// When it last rose ([`Context::now`]), by how much over the window,
    /// and the newest dead letter's reason and error.
    pub(super) rise: Option<(Duration, u64, String)>,
}

/// Jobs of a pool dead-lettered lately, for the `JobsFailing` condition.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Failing {
    /// Dead-lettered within the window.
    pub(super) count: u64,
    /// The newest dead letter: its reason and error, escaped and bounded.
    pub(super) latest: String,
}

impl Context {
    /// Compares the pool's dead-lettered total with the last look. On a
    /// rise, reads the newest dead letter of a queue that rose. On the
    /// first look (a new pool, a restarted operator), judges by the dead
    /// letters' own times instead, so that jobs which died before the
    /// operator looked still show. Returns the jobs dead-lettered within
    /// [`FAILING_FOR`] of the last rise.
    pub(super) async fn failing(
        &self,
        key: &str,
        endpoint: &Endpoint,
        snap: &Snapshot,
    ) -> Option<Failing> {
        let total: u64 = snap.queues.iter().map(|q| q.dead_total).sum();
        let now = self.now();
        let before = self.pool(key, |m| m.dead_seen.clone());
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
        self.pool(key, |m| m.dead_seen = Some(seen));
        failing
    }

    /// The newest dead letters of the pool's queues (a few per queue): how
    /// many died within [`FAILING_FOR`], when the newest died, and its
    /// reason and error.
    pub(super) async fn latest_dead(
        &self,
        endpoint: &Endpoint,
        snap: &Snapshot,
    ) -> Option<(Recent, String)> {
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
pub(super) const RECENT_READ: usize = 20;

/// The newest dead letters as a first look found them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Recent {
    /// Dead-lettered within [`FAILING_FOR`] (of those read).
    pub(super) count: u64,
    /// When the newest died, unix ms (Redis clock; 0: unknown).
    pub(super) newest_ms: u64,
}

impl Recent {
    /// How long ago the newest died, at `server_time_ms`.
    fn newest_age(&self, server_time_ms: u64) -> Option<Duration> {
        (self.newest_ms > 0)
            .then(|| Duration::from_millis(server_time_ms.saturating_sub(self.newest_ms)))
    }
}

/// What one reconcile read: the Deployment, the pods (only while workers
/// are missing, or while the pool protects busy pods or has marks left),
/// the PodDisruptionBudget (only when the pool asks for one), and the
/// queue.
pub(super) struct Observed {
    pub(super) existing: Option<Deployment>,
    /// A Deployment of the pool's name that is someone else's: the pool
    /// counts no workers in it and never applies over it.
    pub(super) foreign: Option<workload::Problem>,
    pub(super) pods: Option<Vec<Pod>>,
    /// The pool's budget as the API server has it (`None`: not read).
    pub(super) budget: Option<Option<PodDisruptionBudget>>,
    pub(super) reading: Result<Snapshot, QueueProblem>,
    /// The eviction policy of the queue's Redis and the keys it evicted
    /// since the pool's last look (`None`: not read).
    pub(super) memory: Option<(Memory, u64)>,
    /// Jobs dead-lettered lately (`None`: none, or the queue not read).
    pub(super) failing: Option<Failing>,
    pub(super) replicas: Replicas,
}

/// The pool's Deployment, its pods when needed, and its budget.
pub(super) struct Workload {
    existing: Option<Deployment>,
    foreign: Option<workload::Problem>,
    pods: Option<Vec<Pod>>,
    budget: Option<Option<PodDisruptionBudget>>,
    replicas: Replicas,
}

/// Reads the Deployment, and the pods when workers are missing.
pub(super) async fn workload(pool: &WorkerPool, ctx: &Context) -> Result<Workload, Error> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let applied = ctx.pool(&pool_key(pool), |m| m.applied.and_then(|(_, g)| g));
    let existing = match ctx.watched_deployment(&namespace, &name, applied) {
        Some(seen) => Some(seen),
        None => {
            let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
            deployments
                .get_opt(&name)
                .await
                .map_err(Error::GetDeployment)?
        }
    };
    let foreign = existing
        .as_ref()
        .and_then(|d| workload::not_owned("Deployment", &d.metadata, pool));
    // Someone else's pods are not the pool's workers.
    let status = existing
        .as_ref()
        .filter(|_| foreign.is_none())
        .and_then(|d| d.status.as_ref());
    let current = existing
        .as_ref()
        .filter(|_| foreign.is_none())
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(0);
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let replicas = status.and_then(|s| s.replicas).unwrap_or(0);
    // Workers missing: the pods say why (an image that cannot be pulled, a
    // crash loop), beside the Deployment (pods refused).
    // Also while busy pods are protected, or marks are left to remove.
    let pods = if existing.is_some()
        && foreign.is_none()
        && (ready < current || disruption::needs_pods(pool))
    {
        Some(list_pods(pool, ctx).await?)
    } else {
        None
    };
    // Also when the last status names one: the spec may no longer ask for it.
    let named = pool
        .status
        .as_ref()
        .is_some_and(|s| s.disruption_budget.is_some());
    let budget = if disruption::budget(pool).is_some() || named {
        let budgets: Api<PodDisruptionBudget> =
            Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
        Some(
            budgets
                .get_opt(&disruption::budget_name(pool))
                .await
                .map_err(Error::GetBudget)?,
        )
    } else {
        None
    };
    Ok(Workload {
        existing,
        foreign,
        pods,
        budget,
        replicas: Replicas {
            desired: 0,
            replicas,
            ready,
            current,
        },
    })
}

/// Reads the queue at `endpoint`, the memory settings of its Redis and its
/// dead letters, beside the `workload`; `endpoint` is the problem when the
/// spec names no Redis that can be used.
pub(super) async fn queue(
    pool: &WorkerPool,
    ctx: &Context,
    workload: Workload,
    endpoint: Result<&Endpoint, &QueueProblem>,
) -> Observed {
    let key = pool_key(pool);
    let queues = pool.spec.queue.redis.queue_keys();
    let (reading, memory, failing) = match endpoint {
        Ok(endpoint) => {
            let reading = ctx.read_queue(endpoint, &queues).await;
            let memory = match (&reading, queues.first()) {
                (Ok(_), Some(q)) => ctx.memory(&key, endpoint, q).await,
                _ => None,
            };
            let failing = match &reading {
                Ok(snap) => ctx.failing(&key, endpoint, snap).await,
                Err(_) => None,
            };
            (reading, memory, failing)
        }
        Err(problem) => (Err(problem.clone()), None, None),
    };
    Observed {
        existing: workload.existing,
        foreign: workload.foreign,
        pods: workload.pods,
        budget: workload.budget,
        reading,
        memory,
        failing,
        replicas: workload.replicas,
    }
}

/// Replica counts of one reconcile.
#[derive(Debug, Clone, Copy)]
pub(super) struct Replicas {
    /// What the pool should have now.
    pub(super) desired: i32,
    /// Pods the Deployment has.
    pub(super) replicas: i32,
    /// Pods ready.
    pub(super) ready: i32,
    /// The Deployment's replicas before this reconcile.
    pub(super) current: i32,
}
