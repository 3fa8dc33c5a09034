//! The schedules of a pool in local mode: each fire enqueued at its time
//! through the same claim as in a cluster, so several local-mode processes
//! (or an operator) on one pool enqueue each fire once.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use workerpool_queue::connection::{Connection, Endpoint};
use workerpool_queue::keys::QueueKeys;

use crate::crd::{ScheduleStatus, WorkerPool};
use crate::schedule::Schedule;
use crate::schedule::fire::{Report, forget_removed, look};

/// How long a timeout the Redis calls of schedules get.
const TIMEOUT: Duration = Duration::from_secs(3);
/// A note that says the same as the last one of its schedule is left out
/// for this long, so that `@every 1s` does not fill the screen.
const QUIET: Duration = Duration::from_secs(60);

/// The schedules of the pool being run, with their own Redis connection.
#[derive(Debug)]
pub struct Schedules {
    endpoint: Endpoint,
    conn: Option<Connection>,
    namespace: String,
    pool: String,
    entries: Vec<Entry>,
    /// When a look last failed to reach Redis: the next waits a second.
    failed: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    schedule: Schedule,
    pending: Option<Timestamp>,
    status: Option<ScheduleStatus>,
    /// The last note's reason and when it was made.
    noted: Option<(&'static str, Instant)>,
    /// Whether it was looked at: one that waits for nothing after a look
    /// never fires again.
    looked: bool,
}

impl Schedules {
    /// The schedules of `pool` (already checked with
    /// [`crate::schedule::parse_all`]). Each waits for the fire after the
    /// latest one claimed in Redis, so that fires missed while nothing ran
    /// follow `startingDeadlineSeconds`; a schedule never fired waits for
    /// its next fire. The claims of schedules the pool no longer has are
    /// forgotten first.
    pub async fn start(pool: &WorkerPool, schedules: Vec<Schedule>, endpoint: Endpoint) -> Self {
        let namespace = pool
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pool.metadata.name.clone().unwrap_or_default();
        let mut this = Self {
            endpoint,
            conn: None,
            namespace,
            pool: name,
            entries: Vec::new(),
            failed: None,
        };
        // What a run of this pool before claimed for schedules it no longer
        // has goes, so that one added again later starts afresh.
        let queues = pool.spec.queue.redis.queue_names();
        let (namespace, name) = (this.namespace.clone(), this.pool.clone());
        if let Ok(conn) = this.conn().await {
            let specs = &pool.spec.schedules;
            let _ = forget_removed(conn, specs, &queues, &namespace, &name).await;
        }
        for schedule in schedules {
            let identity = schedule.identity(&this.namespace, &this.pool);
            let queue = QueueKeys::new(schedule.queue.clone());
            let last = match this.conn().await {
                Ok(conn) => workerpool_queue::schedule::last_fire(conn, &queue, &identity)
                    .await
                    .ok()
                    .flatten(),
                Err(_) => None,
            };
            let pending = last
                .and_then(|ms| Timestamp::from_millisecond(ms).ok())
                .and_then(|t| schedule.next_after(t));
            this.entries.push(Entry {
                schedule,
                pending,
                status: None,
                noted: None,
                looked: false,
            });
        }
        this
    }

    /// Whether there is any schedule to look at.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How long until the earliest fire waited for (zero when one is due
    /// or none is known yet).
    pub fn wait(&self, now: Timestamp) -> Duration {
        // A little past the fire, so that the clock read on waking has
        // reached it.
        let margin = Duration::from_millis(2);
        let due = self
            .entries
            .iter()
            .filter(|e| !e.schedule.suspend)
            .map(|e| match e.pending {
                Some(at) => {
                    let ms = (at.as_millisecond() - now.as_millisecond()).max(0);
                    Duration::from_millis(ms as u64) + margin
                }
                None if e.looked => Duration::from_secs(3600),
                None => Duration::ZERO,
            })
            .min()
            .unwrap_or(Duration::from_secs(3600));
        let backoff = self.failed.map_or(Duration::ZERO, |at| {
            Duration::from_secs(1).saturating_sub(at.elapsed())
        });
        due.max(backoff)
    }

    /// Looks at every schedule at `now`, enqueueing the fires that are due.
    /// Returns the notes to show.
    pub async fn run(&mut self, now: Timestamp) -> Vec<String> {
        let conn = match self.conn().await {
            Ok(c) => c.clone(),
            Err(e) => {
                let first = self.failed.is_none();
                self.failed = Some(Instant::now());
                return if first {
                    vec![format!("schedules: cannot reach Redis: {e}; trying again")]
                } else {
                    Vec::new()
                };
            }
        };
        let mut notes = Vec::new();
        let mut failed = false;
        for entry in &mut self.entries {
            let mut conn = conn.clone();
            let seen = look(
                &mut conn,
                &entry.schedule,
                &self.namespace,
                &self.pool,
                entry.pending,
                entry.status.as_ref(),
                now,
            )
            .await;
            entry.pending = seen.pending;
            entry.looked = true;
            entry.status = Some(seen.status);
            if let Some(Report {
                reason, message, ..
            }) = seen.report
            {
                failed |= reason == "ScheduleFailed";
                let repeat = entry
                    .noted
                    .is_some_and(|(r, at)| r == reason && at.elapsed() < QUIET);
                if !repeat {
                    let mut message = message;
                    if entry.schedule.period_under(QUIET) {
                        message.push_str(" (repeats of this are not shown for a minute)");
                    }
                    notes.push(message);
                    entry.noted = Some((reason, Instant::now()));
                }
            }
        }
        if failed {
            self.conn = None;
            self.failed = Some(Instant::now());
        } else {
            self.failed = None;
        }
        notes
    }

    async fn conn(&mut self) -> redis::RedisResult<&mut Connection> {
        if self.conn.is_none() {
            self.conn = Some(self.endpoint.connect(TIMEOUT, TIMEOUT).await?);
        }
        match self.conn.as_mut() {
            Some(c) => Ok(c),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no connection",
            ))),
        }
    }
}
