//! What the operator remembers between reconciles: one [`PoolMemory`] per
//! pool, and per Redis its connection and memory settings.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use workerpool_queue::connection::{Connection, Endpoint};
use workerpool_queue::memory::Memory;

use super::observe::DeadSeen;
use super::{MANAGER, lock};
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::scaling::Engine;

/// What the operator remembers of one pool between its reconciles.
#[derive(Debug, Default)]
pub(super) struct PoolMemory {
    /// The scaling engine's state.
    pub(super) engine: Engine,
    /// Consecutive failed reconciles, for the retry backoff.
    pub(super) failures: u32,
    /// The workload problem last announced with an event: the pool's
    /// status says it too, but may lag behind a reconcile.
    pub(super) announced: Option<String>,
    /// The Deployment last applied: a hash of what was sent and the
    /// generation the API server gave it. While both still hold, applying
    /// it again would change nothing.
    pub(super) applied: Option<(u64, Option<i64>)>,
    /// When the status was last written ([`Context::now`]).
    pub(super) status_written: Option<Duration>,
    /// The evictions the pool's Redis had counted at the last look.
    pub(super) evicted_seen: Option<u64>,
    /// The dead letters as last seen: the total, and the last rise.
    pub(super) dead_seen: Option<DeadSeen>,
}

/// Shared state of all reconciles.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Metrics,
    /// Each pool's memory, by `namespace/name`.
    pools: Mutex<HashMap<String, PoolMemory>>,
    pub(super) redis: Mutex<HashMap<Endpoint, Connection>>,
    /// The memory settings of each Redis, and when they were read
    /// ([`Context::now`]): read again every [`super::observe::MEMORY_EVERY`].
    pub(super) memory: Mutex<HashMap<Endpoint, (Duration, Memory)>>,
    /// The pools' Deployments as the controller's watch last saw them: their
    /// metadata, replica count and status, what a look reads of them
    /// (`None`: each look reads its pool's from the API server).
    deployments: Option<Store<Deployment>>,
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
            pools: Mutex::new(HashMap::new()),
            redis: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
            deployments: None,
            started: Instant::now(),
        }
    }

    /// Reads the pools' Deployments from `store`, which the controller's
    /// watch of them keeps, instead of from the API server at every look.
    #[must_use]
    pub fn with_deployments(mut self, store: Store<Deployment>) -> Self {
        self.deployments = Some(store);
        self
    }

    /// Deployment `name` in `namespace` as the watch last saw it, unless it
    /// is older than `applied`, the generation this operator's last apply
    /// got back: a look never decides on less than its own last write.
    /// `None` when the watch has not seen it (not there, not labelled as
    /// ours, or the watch not yet listed): the API server is asked then.
    pub(super) fn watched_deployment(
        &self,
        namespace: &str,
        name: &str,
        applied: Option<i64>,
    ) -> Option<Deployment> {
        let store = self.deployments.as_ref()?;
        let seen = store.get(&ObjectRef::new(name).within(namespace))?;
        let fresh = applied.is_none_or(|applied| seen.metadata.generation >= Some(applied));
        fresh.then(|| Deployment::clone(&seen))
    }

    pub(super) fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Runs `f` on the memory of pool `key` (a new pool's is empty).
    pub(super) fn pool<R>(&self, key: &str, f: impl FnOnce(&mut PoolMemory) -> R) -> R {
        let mut pools = lock(&self.pools);
        if let Some(memory) = pools.get_mut(key) {
            return f(memory);
        }
        f(pools.entry(key.to_string()).or_default())
    }

    /// Forgets a deleted pool: its memory and its metrics.
    pub fn forget(&self, key: &str) {
        lock(&self.pools).remove(key);
        if let Some((namespace, pool)) = key.split_once('/') {
            self.metrics.forget_pool(namespace, pool);
        }
    }
}
