//! Registration and the maintenance loop: heartbeats, promotion of due
//! retries and delayed jobs, reaping of lost workers (Sidekiq's launcher
//! and scheduler).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::RedisResult;
use tokio_util::sync::CancellationToken;
use workerpool_queue::keys::Instance;
use workerpool_queue::ops;

use super::ledger::Activity;
use super::settle::shown;
use super::{BLOCK, Error, MEMORY_EVERY, PROMOTE_EVERY, Worker};
use crate::config::ConfigError;

impl Worker {
    fn beat_details(&self) -> Vec<(&'static str, String)> {
        let mut details = vec![
            ("id", self.config.worker_id.clone()),
            ("pid", std::process::id().to_string()),
            ("concurrency", self.config.concurrency.to_string()),
            ("in_flight", self.running().to_string()),
            ("queues", self.queue_names().join(",")),
            // Lets readers (the CLI) tell live workers from lost ones.
            (
                "dead_after_ms",
                self.config.dead_after.as_millis().to_string(),
            ),
            ("version", env!("CARGO_PKG_VERSION").to_string()),
        ];
        if let Some(rate) = &self.config.rate_limit {
            details.push(("rate_limit", rate.to_string()));
        }
        // How long the oldest job in hand has run, or how long none has
        // been: the operator protects a pod from node disruption while it
        // holds a long job, and lets it go once it has been idle.
        let (busy, idle) = match self.ledger().activity(Instant::now()) {
            Activity::Busy(ran) => (ran.as_millis().to_string(), String::new()),
            Activity::Idle(idle) => (String::new(), idle.as_millis().to_string()),
        };
        details.push(("oldest_job_ms", busy));
        details.push(("idle_ms", idle));
        // Readers (the CLI, the operator) can say why a worker runs nothing.
        details.push((
            "handler_problem",
            self.handler.problem().unwrap_or_default(),
        ));
        details
    }

    /// Returns the jobs of this worker id's earlier incarnations (a
    /// restarted container keeps its pod name) and registers this one: at
    /// once those of the instance the instance file names (it has exited,
    /// see [`super::instance_file`]), the others once their heartbeats are
    /// stale. Another live process with the same worker id is left alone
    /// with a warning: this one runs beside it under its own instance (the
    /// id and a nonce).
    /// Keeps trying while Redis is unreachable; `false` if shut down first.
    /// Refuses queue names that cannot share a slot when Redis turns out to
    /// be a cluster.
    pub(super) async fn start(&self) -> Result<bool, Error> {
        let ttl = self.config.dead_after * 2;
        let stop = self.shutdown.drain.clone();
        let Some(cluster) = self
            .redis
            .persist("connect", &stop, |c| async move { Ok(c.is_cluster()) })
            .await
        else {
            return Ok(false);
        };
        if cluster && let Some(problem) = workerpool_queue::keys::cluster_problem(&self.queues) {
            tracing::error!(%problem, "queue names cannot work on this Redis Cluster");
            return Err(ConfigError(problem).into());
        }
        if let Some(refused) = self.check_memory().await {
            tracing::error!(problem = %refused, "--require-noeviction: not starting");
            return Err(ConfigError(format!("--require-noeviction: {refused}")).into());
        }
        let predecessor = self.predecessor().clone();
        let predecessor = predecessor.as_deref();
        let done = self
            .redis
            .persist("register", &stop, |mut c| async move {
                for q in &self.queues {
                    if let Some(earlier) = predecessor {
                        // Regardless of its heartbeat: it has exited.
                        let n = ops::reap(&mut c, q, earlier, None).await?.unwrap_or(0);
                        if n > 0 {
                            tracing::info!(queue = q.name(), earlier = %shown(earlier), jobs = n,
                                "returned the jobs of this container's previous run at once: it has exited (--instance-file)");
                            self.metrics.recovered.with_label_values(&[q.name()]).inc_by(n);
                        }
                    }
                    for (name, beat) in ops::workers(&mut c, q).await? {
                        let earlier = name != self.instance
                            && Instance::id_of(&name) == Some(self.config.worker_id.as_str());
                        if !earlier {
                            continue;
                        }
                        // Only once its heartbeat is stale: a live process
                        // with the same --worker-id (a second local run, a
                        // copied configuration) keeps its jobs.
                        match ops::reap(&mut c, q, &name, Some(self.config.dead_after)).await? {
                            Some(n) => {
                                tracing::info!(queue = q.name(), earlier = %shown(&name), jobs = n, "returned the jobs of an earlier incarnation");
                                self.metrics.recovered.with_label_values(&[q.name()]).inc_by(n);
                            }
                            None => tracing::warn!(
                                queue = q.name(),
                                other = %shown(&name),
                                last_beat_ms_ago = self.now_ms().saturating_sub(beat),
                                "another live worker uses --worker-id {:?}; its jobs stay with it. If it is this \
                                 container's previous run, they return to the queue once its heartbeat is older \
                                 than its dead-after window. Give each worker its own id",
                                self.config.worker_id
                            ),
                        }
                    }
                }
                // Named before it is registered: whatever this instance
                // comes to hold, the next process here finds it.
                self.record_instance();
                for q in &self.queues {
                    let beat = ops::heartbeat(&mut c, q, &self.instance, ttl, &self.beat_details()).await?;
                    self.note_server_time(beat.server_time_ms);
                }
                Ok(())
            })
            .await;
        Ok(done.is_some())
    }

    fn predecessor(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.predecessor.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names this instance in the instance file, for the next process of
    /// this container. A file that cannot be written is a warning: the
    /// next process then waits for this one's heartbeat to go stale.
    fn record_instance(&self) {
        let Some(file) = &self.instance_file else {
            return;
        };
        if let Err(e) = file.record(&self.instance) {
            tracing::warn!(file = %file.path().display(), error = %e,
                "--instance-file: cannot write it; after a restart of this container the next process will \
                 wait for this one's heartbeat to go stale before it takes back its jobs");
        }
    }

    /// Returns, once, what reached the predecessor's processing lists
    /// after the start's return: a job that one of its blocking waits
    /// still moved, had Redis not yet seen its connection close (a proxy
    /// between may keep it open a moment). Such a wait ends within
    /// [`BLOCK`] of the predecessor's end, so a look that long after this
    /// process's start is the last needed; the reaper would never find
    /// the job, since the predecessor is no longer registered.
    async fn look_again_at_predecessor(&self, started: Instant) {
        if started.elapsed() < BLOCK {
            return;
        }
        let Some(earlier) = self.predecessor().clone() else {
            return;
        };
        let Ok(mut c) = self.redis.conn().await else {
            return;
        };
        for q in &self.queues {
            match ops::reap(&mut c, q, &earlier, None).await {
                Ok(n) => {
                    let n = n.unwrap_or(0);
                    if n > 0 {
                        tracing::warn!(queue = q.name(), earlier = %shown(&earlier), jobs = n,
                            "returned jobs that reached this container's previous run after it had exited");
                        self.metrics
                            .recovered
                            .with_label_values(&[q.name()])
                            .inc_by(n);
                    }
                }
                // Tried again at the next round.
                Err(_) => return,
            }
        }
        *self.predecessor() = None;
    }

    /// Reads the eviction policy and evictions of the Redis that holds each
    /// queue. Warns when the policy can delete keys (at the first look and
    /// whenever it changes) and when keys were evicted since the last look;
    /// keeps the gauges. Returns the warning when `--require-noeviction`
    /// refuses this Redis. A Redis that does not answer `INFO` (an ACL
    /// without it) counts as a policy that cannot be read.
    async fn check_memory(&self) -> Option<String> {
        use workerpool_queue::memory::{self, Memory, Risk};
        let mut c = self.redis.conn().await.ok()?;
        let mut refused = None;
        // INFO refused by the ACL is said once, not once per queue.
        let mut told_info_refused = false;
        for (i, q) in self.queues.iter().enumerate() {
            let read = memory::read(&mut c, q).await;
            let now = match &read {
                Ok(m) => m.clone(),
                Err(e) => {
                    tracing::debug!(queue = q.name(), error = %workerpool_queue::connection::describe(e), "cannot read INFO");
                    Memory::default()
                }
            };
            let before = self
                .memory
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(i)
                .and_then(|slot| slot.replace(now.clone()));
            let policy = now.policy.as_deref().unwrap_or("unknown");
            let shown = |m: &Memory| m.policy.clone().unwrap_or_else(|| "unknown".into());
            if let Some(b) = &before
                && shown(b) != policy
            {
                let _ = self
                    .metrics
                    .redis_policy
                    .remove_label_values(&[q.name(), &shown(b)]);
            }
            self.metrics
                .redis_policy
                .with_label_values(&[q.name(), policy])
                .set(1);
            self.metrics
                .redis_evicted_keys
                .with_label_values(&[q.name()])
                .set(i64::try_from(now.evicted_keys).unwrap_or(i64::MAX));
            let changed = before.as_ref().is_none_or(|b| b.policy != now.policy);
            if let Some(warning) = now.warning() {
                if self.config.require_noeviction && refused.is_none() {
                    refused = Some(format!("queue {}: {warning}", q.name()));
                }
                let repeat = now.info_refused && told_info_refused;
                told_info_refused |= now.info_refused;
                if changed && !repeat {
                    match now.risk() {
                        Risk::AllKeys => tracing::error!(queue = q.name(), policy, "{warning}"),
                        _ => tracing::warn!(queue = q.name(), policy, "{warning}"),
                    }
                }
            } else if changed && before.is_some() {
                tracing::info!(queue = q.name(), policy, "Redis no longer evicts keys");
            }
            if let Some(b) = &before
                && now.evicted_keys > b.evicted_keys
                && read.is_ok()
            {
                let what = match now.risk() {
                    Risk::Volatile => {
                        "keys with a TTL (a worker's details, a rate bucket) may be among them"
                    }
                    _ => "jobs of any queue on it may be gone",
                };
                tracing::warn!(
                    queue = q.name(),
                    policy,
                    evicted = now.evicted_keys - b.evicted_keys,
                    "Redis evicted keys since the last look (maxmemory-policy {policy}): {what}"
                );
            }
        }
        refused
    }

    /// Heartbeats, promotes due retries and delayed jobs, returns the jobs
    /// of lost workers; until `stop`.
    pub(super) async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let ttl = self.config.dead_after * 2;
        let tick = self.config.heartbeat_interval.min(PROMOTE_EVERY);
        let mut last_beat: Option<Instant> = None;
        let mut memory_read = Instant::now();
        let mut handler_problem: Option<String> = None;
        let started = Instant::now();
        loop {
            self.health.tick();
            self.look_again_at_predecessor(started).await;
            let problem = self.handler.problem();
            if problem.is_some() != handler_problem.is_some() {
                match &problem {
                    Some(p) => {
                        tracing::error!(problem = %p, "not ready: the handler cannot run jobs")
                    }
                    None => tracing::info!("ready again: the handler runs jobs"),
                }
            }
            self.health.set_handler_problem(problem.clone());
            handler_problem = problem;
            if memory_read.elapsed() >= MEMORY_EVERY.min(self.config.heartbeat_interval * 12) {
                memory_read = Instant::now();
                self.check_memory().await;
            }
            let beat =
                last_beat.is_none_or(|t| t.elapsed() + tick / 2 >= self.config.heartbeat_interval);
            match self.maintenance_round(ttl, beat).await {
                Ok(()) => {
                    self.redis.succeeded("maintenance");
                    if beat {
                        last_beat = Some(Instant::now());
                    }
                }
                Err(e) => self.redis.failed("maintenance", &e),
            }
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Promotes due jobs; with `beat`, also heartbeats and reaps.
    async fn maintenance_round(&self, ttl: Duration, beat: bool) -> RedisResult<()> {
        let mut c = self.redis.conn().await?;
        for q in &self.queues {
            let promoted = ops::promote_due(&mut c, q, 1000).await?;
            if promoted > 0 {
                tracing::debug!(queue = q.name(), promoted, "due jobs promoted");
            }
        }
        self.redis.ok();
        if !beat {
            return Ok(());
        }
        self.check_cancels(&mut c).await;
        let details = self.beat_details();
        for (q, jobs) in self.queues.iter().zip(&self.job_metrics) {
            let timed = jobs.timed_since_told();
            let beat = ops::heartbeat_with(&mut c, q, &self.instance, ttl, &details, timed).await?;
            self.note_server_time(beat.server_time_ms);
            if beat.registered_anew {
                tracing::warn!(
                    queue = q.name(),
                    "this worker was taken for lost and its jobs were returned to the queue; re-registered"
                );
                self.suspect_lost_reply();
            }
        }
        for q in &self.queues {
            let cutoff = self
                .now_ms()
                .saturating_sub(self.config.dead_after.as_millis() as u64);
            for lost in ops::silent_workers(&mut c, q, cutoff).await? {
                if lost == self.instance {
                    continue;
                }
                if let Some(n) = ops::reap(&mut c, q, &lost, Some(self.config.dead_after)).await? {
                    tracing::warn!(queue = q.name(), lost = %shown(&lost), jobs = n, "worker lost; its jobs are back at the head of the queue");
                    if let Some(otel) = &self.otel {
                        otel.recovered(q.name(), &lost, n);
                    }
                    self.metrics
                        .recovered
                        .with_label_values(&[q.name()])
                        .inc_by(n);
                }
            }
        }
        Ok(())
    }
}
