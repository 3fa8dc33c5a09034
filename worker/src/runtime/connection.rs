//! The worker's one door to Redis: a cached connection re-established
//! after failures, dedicated connections for blocking waits, and `persist`
//! (retry with backoff until done or stopped), with health and metrics.

use super::*;

/// The worker's Redis connection, re-established after failures.
pub(super) struct Redis {
    pub(super) endpoint: workerpool_queue::connection::Endpoint,
    pub(super) current: Mutex<Option<Connection>>,
    pub(super) connecting: tokio::sync::Mutex<()>,
    pub(super) health: Arc<Health>,
    pub(super) metrics: Metrics,
    /// The last failure, for messages that say what went wrong.
    pub(super) last_error: Mutex<Option<String>>,
}

impl Redis {
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

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

    /// A dedicated connection for blocking commands on `queue`, and its
    /// client id on the node that serves the queue (for `CLIENT UNBLOCK`).
    pub(super) async fn blocking_conn(&self, queue: &QueueKeys) -> RedisResult<Blocker> {
        let mut conn = self
            .endpoint
            .connect(Self::CONNECT_TIMEOUT, BLOCK + Duration::from_secs(3))
            .await?;
        let id: i64 = conn
            .on_node_of(queue.waiting(), redis::cmd("CLIENT").arg("ID"))
            .await?;
        Ok(Blocker { conn, id })
    }

    pub(super) fn cached(&self) -> Option<Connection> {
        self.slot().clone()
    }

    pub(super) fn slot(&self) -> std::sync::MutexGuard<'_, Option<Connection>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn ok(&self) {
        self.health.set_redis_ok(true);
    }

    pub(super) fn failed(&self, operation: &'static str, error: &RedisError) {
        self.metrics
            .redis_errors
            .with_label_values(&[operation])
            .inc();
        let lost = unreachable(error);
        let error = self.endpoint.describe(error);
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
            Ok(_) => self.ok(),
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
                    self.ok();
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
    /// Its client id on the node that serves the queue.
    pub(super) id: i64,
}

/// Whether `error` means Redis could not be reached (connection refused,
/// dropped or timed out), as opposed to an answer that was an error.
pub(super) fn unreachable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
}
