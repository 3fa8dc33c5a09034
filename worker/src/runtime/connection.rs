//! The worker's one door to Redis: a cached connection re-established
//! after failures, dedicated connections for blocking waits, and `persist`
//! (retry with backoff until done or stopped), with health and metrics.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{RedisError, RedisResult};
use tokio_util::sync::CancellationToken;
use workerpool_queue::connection::{Connection, Endpoint, refused};
use workerpool_queue::keys::QueueKeys;

use super::BLOCK;
use crate::backoff::Reconnect;
use crate::metrics::Metrics;
use crate::probes::Health;

/// The worker's Redis connection, re-established after failures.
pub(super) struct Redis {
    endpoint: Endpoint,
    current: Mutex<Option<Connection>>,
    connecting: tokio::sync::Mutex<()>,
    health: Arc<Health>,
    metrics: Metrics,
    /// The last failure, for messages that say what went wrong.
    last_error: Mutex<Option<String>>,
    /// Operations the ACL refuses, with what `/readyz` says, until each
    /// succeeds.
    refusals: Mutex<BTreeMap<&'static str, String>>,
    /// Set once the ACL refused `CLIENT ID` or `CLIENT UNBLOCK`: blocking
    /// waits then run without an id and end at their own timeout.
    client_refused: AtomicBool,
    /// [`Connection::primaries_found`] when last looked at (0: not yet).
    primaries_seen: AtomicU64,
}

impl Redis {
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

    /// Connects to `endpoint` when first asked, reporting to `health` and
    /// `metrics`.
    pub(super) fn new(endpoint: Endpoint, health: Arc<Health>, metrics: Metrics) -> Self {
        Self {
            endpoint,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            health,
            metrics,
            last_error: Mutex::new(None),
            refusals: Mutex::new(BTreeMap::new()),
            client_refused: AtomicBool::new(false),
            primaries_seen: AtomicU64::new(0),
        }
    }

    /// Whether the ACL refused `CLIENT ID` or `CLIENT UNBLOCK`.
    pub(super) fn client_commands_refused(&self) -> bool {
        self.client_refused.load(Ordering::Relaxed)
    }

    pub(super) async fn conn(&self) -> RedisResult<Connection> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let c = self
            .endpoint
            .connect(Self::CONNECT_TIMEOUT, Self::RESPONSE_TIMEOUT)
            .await?;
        *self.slot() = Some(c.clone());
        Ok(c)
    }

    /// Whether `c` has found a primary other than the one it had when last
    /// asked (Redis Sentinel: after a failover, or a lost socket). Writes
    /// the old primary took after the replica's promotion are lost, and the
    /// new one may hold, from before them, processing-list entries of jobs
    /// this process has since settled: its processing lists are to be
    /// checked against the ledger. The first look only notes the count.
    pub(super) fn found_new_primary(&self, c: &Connection) -> bool {
        let Some(found) = c.primaries_found() else {
            return false;
        };
        let seen = self.primaries_seen.swap(found, Ordering::Relaxed);
        seen != 0 && seen != found
    }

    /// A dedicated connection for blocking commands on `queue`, and its
    /// client id on the node that serves the queue (for `CLIENT UNBLOCK`),
    /// unless the ACL refuses `CLIENT ID` (optional: see
    /// [`Redis::without_client_commands`]).
    pub(super) async fn blocking_conn(&self, queue: &QueueKeys) -> RedisResult<Blocker> {
        let mut conn = self
            .endpoint
            .connect(Self::CONNECT_TIMEOUT, BLOCK + Duration::from_secs(3))
            .await?;
        if self.client_refused.load(Ordering::Relaxed) {
            return Ok(Blocker { conn, id: None });
        }
        let id = match conn
            .on_node_of::<i64>(queue.waiting(), redis::cmd("CLIENT").arg("ID"))
            .await
        {
            Ok(id) => Some(id),
            Err(e) if refused(&e).is_some() => {
                self.without_client_commands(&e);
                None
            }
            Err(e) => return Err(e),
        };
        Ok(Blocker { conn, id })
    }

    /// Notes, with one warning for the life of the process, that the ACL
    /// refuses `CLIENT ID` or `CLIENT UNBLOCK`. Both are optional: jobs
    /// run as before, but a blocked wait can no longer be cut short, so
    /// it ends at its own timeout ([`BLOCK`]).
    pub(super) fn without_client_commands(&self, error: &RedisError) {
        if self.client_refused.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            error = %self.endpoint.describe(error),
            "the Redis user may not run CLIENT ID or CLIENT UNBLOCK (ACL); jobs still run, \
             but a blocked wait for jobs is no longer cut short: a shutdown waits up to {}s \
             longer, and with several queues a job that arrives on one may start up to {}s \
             late. Grant +client|id +client|unblock to avoid it (docs/redis-acl.md)",
            BLOCK.as_secs(),
            BLOCK.as_secs()
        );
    }

    fn cached(&self) -> Option<Connection> {
        self.slot().clone()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Connection>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn ok(&self) {
        self.health.set_redis_ok(true);
    }

    /// `operation` succeeded: a refusal of it by the ACL is over.
    pub(super) fn succeeded(&self, operation: &'static str) {
        self.ok();
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if refusals.remove(operation).is_some() {
            tracing::info!(operation, "Redis allows it now");
            self.health
                .set_redis_refused(refusals.values().next().cloned());
        }
    }

    pub(super) fn failed(&self, operation: &'static str, error: &RedisError) {
        self.metrics
            .redis_errors
            .with_label_values(&[operation])
            .inc();
        let lost = unreachable(error);
        let refused = refused(error).is_some();
        let error = self.endpoint.describe(error);
        if refused {
            // The worker stays unready until this very operation succeeds
            // (the ACL granted it); the refusal is logged once meanwhile.
            let problem = format!("redis refused {operation}: {error}");
            let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            if refusals.get(operation) == Some(&problem) {
                tracing::debug!(operation, %error, "redis command refused again");
            } else {
                tracing::error!(operation, %error, "redis command refused");
            }
            refusals.insert(operation, problem.clone());
            self.health
                .set_redis_refused(refusals.values().next().cloned());
            self.health.set_redis_failed(problem.clone());
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(problem);
            return;
        }
        let what = if lost {
            *self.slot() = None;
            tracing::warn!(operation, %error, "redis unreachable");
            "redis unreachable"
        } else {
            // The server answered: an error reply, or a reply this worker
            // could not read. Reconnecting would not change it.
            tracing::error!(operation, %error, "redis command failed");
            "redis command failed"
        };
        let problem = format!("{what} ({operation}): {error}");
        self.health.set_redis_failed(problem.clone());
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(problem);
    }

    pub(super) fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "redis unreachable".into())
    }

    /// Runs `op` once on the shared connection, recording the outcome in
    /// readiness and metrics.
    pub(super) async fn once<T, F, Fut>(&self, operation: &'static str, op: F) -> RedisResult<T>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let result = match self.conn().await {
            Ok(c) => op(c).await,
            Err(e) => Err(e),
        };
        match &result {
            Ok(_) => self.succeeded(operation),
            Err(e) => self.failed(operation, e),
        }
        result
    }

    /// Runs `op` until it succeeds, reconnecting with backoff, or until
    /// `stop` fires (`None`).
    pub(super) async fn persist<T, F, Fut>(
        &self,
        operation: &'static str,
        stop: &CancellationToken,
        mut op: F,
    ) -> Option<T>
    where
        F: FnMut(Connection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut backoff = Reconnect::new();
        loop {
            let result = match self.conn().await {
                Ok(c) => op(c).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => {
                    self.succeeded(operation);
                    return Some(v);
                }
                Err(e) => self.failed(operation, &e),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()) => {}
                _ = stop.cancelled() => return None,
            }
        }
    }
}

/// A connection kept for blocking waits on one queue.
pub(super) struct Blocker {
    pub(super) conn: Connection,
    /// Its client id on the node that serves the queue; `None` when the
    /// ACL refuses `CLIENT ID`.
    pub(super) id: Option<i64>,
}

/// Whether `error` means Redis could not be reached (connection refused,
/// dropped or timed out), as opposed to an answer that was an error.
fn unreachable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
}
