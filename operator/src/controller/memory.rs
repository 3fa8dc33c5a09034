//! What the operator remembers between reconciles: the shared context.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;
use workerpool_queue::connection::{Connection, Endpoint};
use workerpool_queue::memory::Memory;

use super::observe::DeadSeen;
use super::{MANAGER, lock};
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::scaling::Engine;

/// Shared state of all reconciles.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Metrics,
    pub(super) engines: Mutex<HashMap<String, Engine>>,
    pub(super) redis: Mutex<HashMap<Endpoint, Connection>>,
    /// Consecutive failed reconciles per pool, for the retry backoff.
    pub(super) failures: Mutex<HashMap<String, u32>>,
    /// The workload problem last announced with an event, per pool: the
    /// pool's status says it too, but may lag behind a reconcile.
    pub(super) announced: Mutex<HashMap<String, String>>,
    /// The Deployment last applied per pool: a hash of what was sent and
    /// the generation the API server gave it. While both still hold,
    /// applying it again would change nothing.
    pub(super) applied: Mutex<HashMap<String, (u64, Option<i64>)>>,
    /// When each pool's status was last written ([`Context::now`]).
    pub(super) status_written: Mutex<HashMap<String, Duration>>,
    /// The memory settings of each Redis, and when they were read
    /// ([`Context::now`]): read again every [`MEMORY_EVERY`].
    pub(super) memory: Mutex<HashMap<Endpoint, (Duration, Memory)>>,
    /// The evictions each pool's Redis had counted at the pool's last look.
    pub(super) evicted_seen: Mutex<HashMap<String, u64>>,
    /// Each pool's dead letters as last seen: the total, and the last rise.
    pub(super) dead_seen: Mutex<HashMap<String, DeadSeen>>,
    pub(super) started: Instant,
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

    pub(super) fn now(&self) -> Duration {
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
}
