//! Taking jobs while slots are free: a batch script when the queues have
//! jobs, else a blocking wait on every queue at once (Sidekiq's fetch),
//! each wait followed by the same script in one round trip (see
//! [`ops::wait_then_fetch`]), so no payload reaches the worker before
//! the script has checked its size.
//! With a rate limit the script is the only way in (a blocking move would
//! bypass the bucket): an empty fetch polls again after [`RATE_POLL`], and
//! one the limit stopped waits until the bucket allows the next start.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::{RedisError, RedisResult};
use tokio::sync::OwnedSemaphorePermit;
use workerpool_queue::ops::{self, Fetched, WaitProbe};

use super::connection::Blocker;
use super::{BLOCK, MAX_BATCH, RATE_POLL, Worker};
use crate::backoff::Reconnect;

impl Worker {
    /// Takes jobs while slots are free, until the drain starts.
    pub(super) async fn fetch_loop(self: Arc<Self>) {
        let slots = &self.slots;
        let drain = self.shutdown.drain.clone();
        let mut blockers: Vec<Option<Blocker>> = self.queues.iter().map(|_| None).collect();
        let mut backoff = Reconnect::new();
        loop {
            let first = tokio::select! {
                biased;
                _ = drain.cancelled() => break,
                permit = slots.clone().acquire_owned() => permit.expect("the slot semaphore is never closed"),
            };
            let mut permits = vec![first];
            while permits.len() < MAX_BATCH {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let round = self.fetch_round(&mut permits, &mut blockers).await;
            match round {
                Ok(pause) => {
                    backoff.reset();
                    drop(permits);
                    if let Some(pause) = pause {
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = drain.cancelled() => break,
                        }
                    }
                }
                Err(RedisFailure { operation, error }) => {
                    self.redis.failed(operation, &error);
                    drop(permits);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                        _ = drain.cancelled() => break,
                    }
                }
            }
        }
    }

    /// One fetch, then the jobs' dispatch. Returns how long to wait before
    /// the next fetch: set only with a rate limit.
    async fn fetch_round(
        self: &Arc<Self>,
        permits: &mut Vec<OwnedSemaphorePermit>,
        blockers: &mut [Option<Blocker>],
    ) -> Result<Option<Duration>, RedisFailure> {
        let mut c = self
            .redis
            .conn()
            .await
            .map_err(|e| RedisFailure::new("connect", e))?;
        if self.redis.found_new_primary(&c) {
            tracing::warn!(
                "Redis has a new primary (a failover): this worker's processing lists are checked against the jobs it runs"
            );
            self.suspect_lost_reply();
        }
        if self.lost_reply.swap(false, Ordering::Relaxed) {
            if let Err(e) = self.recheck_lost_replies().await {
                self.suspect_lost_reply();
                return Err(RedisFailure::new("recheck_lost_replies", e));
            }
            self.redis.succeeded("recheck_lost_replies");
        }
        let started = Instant::now();
        let rate = self.config.rate_limit.as_ref();
        let taken = match ops::fetch(
            &mut c,
            &self.queues,
            &self.instance,
            permits.len(),
            self.limits(),
            rate,
        )
        .await
        {
            Ok(f) => f,
            Err(e) => {
                // The script may have moved jobs before the reply was lost.
                self.suspect_lost_reply();
                return Err(RedisFailure::new("fetch", e));
            }
        };
        self.redis.succeeded("connect");
        self.redis.succeeded("fetch");
        let pause = taken.limited.map(|limited| self.limited(limited));
        self.log_too_large(&taken.too_large);
        if !taken.jobs.is_empty() || !taken.too_large.is_empty() {
            self.metrics
                .fetch_duration
                .observe(started.elapsed().as_secs_f64());
            self.dispatch(taken.jobs, permits).await;
            return Ok(pause);
        }
        if rate.is_some() || self.poll_only.load(Ordering::Relaxed) {
            return Ok(Some(pause.unwrap_or(RATE_POLL)));
        }
        permits.truncate(1);
        let (arrived, refused) = self.wait_for_jobs(blockers).await?;
        self.dispatch(arrived, permits).await;
        // A wait Redis refused (out of memory, an ACL without BLMOVE) is a
        // failed round like any other: the loop backs off before the next.
        match refused {
            Some(e) => Err(RedisFailure::new("wait", e)),
            None => {
                self.redis.succeeded("wait");
                Ok(None)
            }
        }
    }

    /// Counts a taking the rate limit stopped, and says how long the fetch
    /// loop waits for it: the whole wait with one queue, else at most
    /// [`RATE_POLL`] so that jobs on the other queues are not held up.
    fn limited(&self, limited: ops::Limited) -> Duration {
        let name = self.queues[limited.queue].name();
        self.metrics.rate_limited.with_label_values(&[name]).inc();
        let pause = if self.queues.len() > 1 {
            limited.wait.min(RATE_POLL)
        } else {
            limited.wait
        };
        self.metrics
            .rate_limit_wait
            .with_label_values(&[name])
            .inc_by(pause.as_secs_f64());
        pause
    }

    /// Blocks on every queue at once (one connection each) until a job
    /// arrives or the wait times out; when one queue delivers, the others
    /// are unblocked, and everything they delivered meanwhile is returned,
    /// with the first error of a wait that failed.
    async fn wait_for_jobs(
        &self,
        blockers: &mut [Option<Blocker>],
    ) -> Result<(Vec<Fetched>, Option<RedisError>), RedisFailure> {
        for (b, q) in blockers.iter_mut().zip(&self.queues) {
            if b.is_none() {
                let mut blocker = self
                    .redis
                    .blocking_conn(q)
                    .await
                    .map_err(|e| RedisFailure::new("connect", e))?;
                // Learned before the first wait, which could otherwise take
                // a job unheard of (see ops::probe_wait).
                match ops::probe_wait(&mut blocker.conn, q)
                    .await
                    .map_err(|e| RedisFailure::new("wait", e))?
                {
                    WaitProbe::Blocks => *b = Some(blocker),
                    WaitProbe::ReplyRefused(e) => {
                        self.poll_instead(&e);
                        blockers.iter_mut().for_each(|b| *b = None);
                        return Ok((Vec::new(), None));
                    }
                }
            }
        }
        let ids: Vec<i64> = blockers.iter().flatten().filter_map(|b| b.id).collect();
        let drain = self.shutdown.drain.clone();
        let mut waits: FuturesUnordered<_> = blockers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, b)| b.as_mut().map(|b| (i, &mut b.conn)))
            .map(|(i, c)| {
                let q = &self.queues[i];
                let instance = self.instance.as_str();
                let limits = self.limits();
                async move { (i, ops::wait_then_fetch(c, q, instance, BLOCK, limits).await) }
            })
            .collect();
        let mut arrived = Vec::new();
        let mut broken = Vec::new();
        let mut refused = None;
        let mut unblocked = false;
        loop {
            tokio::select! {
                next = waits.next() => match next {
                    None => break,
                    Some((i, Ok(mut taken))) => {
                        // The script was given this one queue: index 0.
                        taken.jobs.iter_mut().for_each(|j| j.queue = i);
                        taken.too_large.iter_mut().for_each(|t| t.queue = i);
                        self.log_too_large(&taken.too_large);
                        let delivered = !taken.jobs.is_empty() || !taken.too_large.is_empty();
                        arrived.extend(taken.jobs);
                        if delivered && !unblocked && ids.len() > 1 {
                            unblocked = true;
                            self.unblock(&ids).await;
                        }
                    }
                    Some((i, Err(e))) if ops::reply_skip_refused(&e) => {
                        // Refused after the probe allowed it (the ACL
                        // changed meanwhile): the BLMOVE and the script
                        // sent with it ran all the same, and the script may
                        // have moved a job into the processing list whose
                        // reply goes with the connection. The recheck
                        // returns it; the worker polls from now on.
                        self.suspect_lost_reply();
                        self.poll_instead(&e);
                        broken.push(i);
                    }
                    Some((i, Err(e))) => {
                        self.suspect_lost_reply();
                        broken.push(i);
                        refused.get_or_insert(e);
                    }
                },
                _ = drain.cancelled(), if !unblocked => {
                    unblocked = true;
                    self.unblock(&ids).await;
                }
            }
        }
        drop(waits);
        for i in broken {
            blockers[i] = None;
        }
        Ok((arrived, refused))
    }

    /// Fetches by polling from now on: the Redis user may not run
    /// `CLIENT REPLY`, an optional command (one warning for the life of
    /// the process).
    fn poll_instead(&self, error: &RedisError) {
        if !self.poll_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %error, "the Redis user may not run CLIENT REPLY, which the blocking wait needs so that no job's bytes are sent before its size is checked: fetching by polling every 100ms instead; grant +client|reply to avoid it (docs/redis-acl.md)");
        }
    }

    async fn unblock(&self, ids: &[i64]) {
        let Ok(mut c) = self.redis.conn().await else {
            return;
        };
        // A worker's queues share one node: on a cluster they share a slot.
        let node_of = self.queues[0].waiting();
        for id in ids {
            if self.redis.client_commands_refused() {
                return;
            }
            let unblocked: RedisResult<i64> = c
                .on_node_of(node_of, redis::cmd("CLIENT").arg("UNBLOCK").arg(id))
                .await;
            // The blocked command then ends at its own timeout instead.
            match unblocked {
                Err(e) if workerpool_queue::connection::refused(&e).is_some() => {
                    self.redis.without_client_commands(&e);
                }
                Err(e) => tracing::debug!(error = %e, "client unblock failed"),
                Ok(_) => {}
            }
        }
    }
}

/// A failed Redis call of a fetch round: which operation, and why.
struct RedisFailure {
    operation: &'static str,
    error: RedisError,
}

impl RedisFailure {
    fn new(operation: &'static str, error: RedisError) -> Self {
        Self { operation, error }
    }
}
