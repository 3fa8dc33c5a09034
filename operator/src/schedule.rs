//! Recurring schedules (`spec.schedules`): when each fires and what it
//! enqueues. Pure code, time passed in: the controller and local mode ask
//! [`Schedule::step`] what is due, claim the fire in Redis
//! (`workerpool_queue::schedule`), and remember the next fire.
//!
//! Fire times are instants (unix milliseconds), whole seconds always: cron
//! expressions are read on the wall clock of the schedule's time zone with
//! `croner`, which follows the Open Cron Pattern Specification on the days
//! clocks change: a time that does not exist (2:30 when 2:00 becomes 3:00)
//! fires at the first instant after the gap, and a time that happens twice
//! fires once, the first time, for an expression that names one hour and
//! minute; `0 * * * *` and other repeating ones fire on every real
//! instant that matches (both 2:00s, no 2:00 in the gap). `@every D` fires
//! at every multiple of D since the Unix epoch, so every process that reads
//! the schedule agrees on its fire times without talking to the others.

use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde_json::{Map, Value};
use workerpool_queue::job::field;

use crate::crd::{ConcurrencyPolicy, ScheduleSpec, WorkerPool};

pub mod fire;

/// The job field that names the schedule a job came from.
pub const SCHEDULE_FIELD: &str = "schedule";

/// How long a `Forbid` schedule's job holds its unique key at most, when
/// the job does not say (`unique_for`): a lost job blocks its schedule no
/// longer than this.
pub const DEFAULT_HOLD_SECS: u64 = 24 * 3600;

/// One schedule of a pool, checked and ready to answer what is due.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The schedule's name.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// What a fire does while the previous job is still in the queue.
    pub policy: ConcurrencyPolicy,
    /// A fire later than this is skipped.
    pub deadline: Option<Duration>,
    /// No fires while true.
    pub suspend: bool,
    when: When,
    zone: TimeZone,
    job: Map<String, Value>,
    /// The job's own `unique_for`, in seconds, when it has one.
    hold: Option<u64>,
}

#[derive(Debug, Clone)]
enum When {
    Cron(Box<Cron>),
    /// `@every`, in milliseconds (whole seconds).
    Every(i64),
}

/// What a schedule should do at a given time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing is due; `next` is the next fire.
    Wait {
        /// The next fire time, `None` when the expression never fires again.
        next: Option<Timestamp>,
    },
    /// Enqueue the fire at `at`.
    Fire {
        /// The fire time.
        at: Timestamp,
        /// The fire after `at` and after now.
        next: Option<Timestamp>,
        /// Earlier fires were missed since the one waited for (only the
        /// latest runs, as with a CronJob).
        earlier_missed: bool,
    },
    /// Skip the fire at `at`: it was missed by more than the deadline.
    Missed {
        /// The fire time.
        at: Timestamp,
        /// How late it is.
        late: Duration,
        /// The next fire.
        next: Option<Timestamp>,
    },
    /// The schedule is suspended: no fire is waited for.
    Suspended,
}

impl Schedule {
    /// Checks one entry of `spec.schedules` (at `index`) of a pool serving
    /// `queues`; the error names the schedule and says what to fix.
    pub fn parse(spec: &ScheduleSpec, index: usize, queues: &[String]) -> Result<Self, String> {
        let at = format!("spec.schedules[{index}] ({})", spec.name);
        let when = parse_when(&spec.schedule)
            .map_err(|why| format!("{at}: schedule {:?} cannot be used: {why}", spec.schedule))?;
        let zone = match spec.time_zone.as_deref() {
            None => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| {
                format!(
                    "{at}: timeZone {name:?} is not an IANA time zone; use a name such as UTC, Europe/Berlin or America/New_York"
                )
            })?,
        };
        let queue = match &spec.queue {
            None => queues.first().cloned().unwrap_or_default(),
            Some(q) if queues.contains(q) => q.clone(),
            Some(q) => {
                return Err(format!(
                    "{at}: queue {q:?} is not one of the pool's queues ({})",
                    queues.join(", ")
                ));
            }
        };
        // Forbid gives the job its unique key; the job may set the hold.
        let hold = match spec.concurrency_policy {
            ConcurrencyPolicy::Allow => {
                workerpool_queue::job::unique_of(&spec.job)
                    .map_err(|e| format!("{at}: job: {e}"))?;
                None
            }
            ConcurrencyPolicy::Forbid => match spec.job.get(field::UNIQUE_FOR) {
                None => None,
                Some(v) => Some(v.as_u64().filter(|secs| *secs > 0).ok_or_else(|| {
                    format!(
                        "{at}: job.unique_for must be a whole number of seconds above 0, got {v}"
                    )
                })?),
            },
        };
        Ok(Self {
            name: spec.name.clone(),
            queue,
            policy: spec.concurrency_policy,
            deadline: spec
                .starting_deadline_seconds
                .map(|s| Duration::from_secs(s.max(0) as u64)),
            suspend: spec.suspend,
            when,
            zone,
            job: spec.job.clone(),
            hold,
        })
    }

    /// The first fire strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match &self.when {
            When::Every(ms) => {
                let now = t.as_millisecond();
                Timestamp::from_millisecond((now.div_euclid(*ms) + 1) * ms).ok()
            }
            When::Cron(cron) => cron
                .find_next_occurrence(&t.to_zoned(self.zone.clone()), false)
                .ok()
                .map(|z| z.timestamp()),
        }
    }

    /// The first fire at or after `t`.
    fn first_from(&self, t: Timestamp) -> Option<Timestamp> {
        match &self.when {
            When::Every(_) => self.next_after(t - jiff::SignedDuration::from_millis(1)),
            When::Cron(cron) => cron
                .find_next_occurrence(&t.to_zoned(self.zone.clone()), true)
                .ok()
                .map(|z| z.timestamp()),
        }
    }

    /// The latest fire at or before `t`.
    pub fn latest_until(&self, t: Timestamp) -> Option<Timestamp> {
        match &self.when {
            When::Every(ms) => {
                Timestamp::from_millisecond(t.as_millisecond().div_euclid(*ms) * ms).ok()
            }
            When::Cron(cron) => cron
                .find_previous_occurrence(&t.to_zoned(self.zone.clone()), true)
                .ok()
                .map(|z| z.timestamp()),
        }
    }

    /// What is due at `now`, when the fire waited for is `pending` (the
    /// next fire remembered after the last one; `None` for a schedule seen
    /// for the first time, which waits for its next fire rather than run
    /// one from before it existed). Of the fires from `pending` to `now`
    /// only the latest runs, and only within the deadline.
    pub fn step(&self, pending: Option<Timestamp>, now: Timestamp) -> Step {
        if self.suspend {
            return Step::Suspended;
        }
        let next = self.next_after(now);
        let Some(pending) = pending.filter(|p| *p <= now) else {
            return Step::Wait { next };
        };
        let Some(at) = self.latest_until(now).filter(|at| *at >= pending) else {
            return Step::Wait { next };
        };
        let late = Duration::from_millis((now.as_millisecond() - at.as_millisecond()) as u64);
        if self.deadline.is_some_and(|d| late > d) {
            return Step::Missed { at, late, next };
        }
        let earlier_missed = self.first_from(pending).is_some_and(|first| first < at);
        Step::Fire {
            at,
            next,
            earlier_missed,
        }
    }

    /// Whether the schedule fires more often than every `d`.
    pub fn period_under(&self, d: Duration) -> bool {
        let d = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match &self.when {
            When::Every(ms) => *ms < d,
            When::Cron(_) => {
                let first = self.next_after(Timestamp::UNIX_EPOCH);
                let second = first.and_then(|t| self.next_after(t));
                match (first, second) {
                    (Some(a), Some(b)) => b.as_millisecond() - a.as_millisecond() < d,
                    _ => false,
                }
            }
        }
    }

    /// The schedule's identity in Redis: `<namespace>/<pool>/<name>`.
    pub fn identity(&self, namespace: &str, pool: &str) -> String {
        owner(namespace, pool) + &self.name
    }

    /// The id of the fire at `at`: the same in every process, so a fire
    /// enqueued twice would be seen as one job.
    pub fn job_id(&self, namespace: &str, pool: &str, at: Timestamp) -> String {
        format!("{}/{}", self.identity(namespace, pool), at.as_millisecond())
    }

    /// The unique key a `Forbid` schedule's jobs hold.
    pub fn unique_key(&self, namespace: &str, pool: &str) -> String {
        format!("schedule:{}", self.identity(namespace, pool))
    }

    /// The job of the fire at `at`, enqueued at `now`: `id` first, then the
    /// spec's job, then `schedule`, `enqueued_at`, and for `Forbid` the
    /// unique key with its hold (the job's own `unique_for`, else a day).
    pub fn payload(
        &self,
        namespace: &str,
        pool: &str,
        at: Timestamp,
        now: Timestamp,
    ) -> Map<String, Value> {
        let mut job = Map::new();
        job.insert(
            field::ID.into(),
            Value::from(self.job_id(namespace, pool, at)),
        );
        let ours = [
            field::ID,
            SCHEDULE_FIELD,
            field::ENQUEUED_AT,
            field::UNIQUE_KEY,
            field::UNIQUE_FOR,
        ];
        let keeps_unique = self.policy == ConcurrencyPolicy::Allow;
        for (k, v) in &self.job {
            let unique = k == field::UNIQUE_KEY || k == field::UNIQUE_FOR;
            if !ours.contains(&k.as_str()) || (unique && keeps_unique) {
                job.insert(k.clone(), v.clone());
            }
        }
        job.insert(SCHEDULE_FIELD.into(), Value::from(self.name.clone()));
        job.insert(field::ENQUEUED_AT.into(), Value::from(now.as_millisecond()));
        if self.policy == ConcurrencyPolicy::Forbid {
            job.insert(
                field::UNIQUE_KEY.into(),
                Value::from(self.unique_key(namespace, pool)),
            );
            job.insert(
                field::UNIQUE_FOR.into(),
                Value::from(self.hold.unwrap_or(DEFAULT_HOLD_SECS)),
            );
        }
        job
    }
}

/// What the identities of one pool's schedules start with:
/// `<namespace>/<pool>/`.
pub fn owner(namespace: &str, pool: &str) -> String {
    format!("{namespace}/{pool}/")
}

/// The names of the schedules in `specs` that enqueue on `queue`, for a
/// pool of `queues` (a schedule without `queue` enqueues on the first):
/// whose claims on `queue` are still in use. A schedule that cannot be
/// used still counts, so that fixing it picks up where it was.
pub fn names_on<'a>(specs: &'a [ScheduleSpec], queues: &[String], queue: &str) -> Vec<&'a str> {
    let first = queues.first().map(String::as_str);
    specs
        .iter()
        .filter(|s| s.queue.as_deref().or(first) == Some(queue))
        .map(|s| s.name.as_str())
        .collect()
}

/// Every schedule of a pool, or one line per problem (each naming its
/// schedule). Checks what the CRD's schema and CEL rules check too, for
/// local mode, which has no API server: names, their uniqueness, queues.
pub fn parse_all(pool: &WorkerPool) -> Result<Vec<Schedule>, Vec<String>> {
    let queues = pool.spec.queue.redis.queue_names();
    let mut problems = Vec::new();
    let mut schedules = Vec::new();
    for (i, spec) in pool.spec.schedules.iter().enumerate() {
        if !is_dns_label(&spec.name) {
            problems.push(format!(
                "spec.schedules[{i}].name {:?} must be a DNS label: 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit",
                spec.name
            ));
            continue;
        }
        if pool.spec.schedules[..i].iter().any(|s| s.name == spec.name) {
            problems.push(format!(
                "spec.schedules[{i}] ({}): another schedule has this name; give each its own",
                spec.name
            ));
            continue;
        }
        match Schedule::parse(spec, i, &queues) {
            Ok(s) => schedules.push(s),
            Err(e) => problems.push(e),
        }
    }
    if problems.is_empty() {
        Ok(schedules)
    } else {
        Err(problems)
    }
}

fn is_dns_label(name: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| ok(*b) || *b == b'-')
        && bytes.first().copied().is_some_and(ok)
        && bytes.last().copied().is_some_and(ok)
}

fn parse_when(text: &str) -> Result<When, String> {
    let text = text.trim();
    if let Some(every) = text.strip_prefix("@every") {
        let every = every.trim();
        let d = humantime::parse_duration(every)
            .map_err(|e| format!("@every needs a duration such as 30s or 5m ({e})"))?;
        if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
            return Err(format!(
                "@every needs whole seconds, at least 1s; got {every}"
            ));
        }
        let ms = i64::try_from(d.as_millis()).map_err(|_| "@every is too long".to_string())?;
        return Ok(When::Every(ms));
    }
    let text = if text.eq_ignore_ascii_case("@midnight") {
        "@daily"
    } else {
        text
    };
    if text.starts_with('@') && !text.contains(' ') {
        let known = [
            "@yearly",
            "@annually",
            "@monthly",
            "@weekly",
            "@daily",
            "@hourly",
        ];
        if !known.iter().any(|k| k.eq_ignore_ascii_case(text)) {
            return Err(
                "use @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually or @every <duration>"
                    .into(),
            );
        }
    } else if text.split_whitespace().count() != 5 {
        return Err(format!(
            "a cron expression has 5 fields (minute hour day-of-month month day-of-week), this one {}",
            text.split_whitespace().count()
        ));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| e.to_string())?;
    // An expression that never matches (30 February) is refused here rather
    // than silently never firing.
    cron.find_next_occurrence(&Timestamp::UNIX_EPOCH.to_zoned(TimeZone::UTC), false)
        .map_err(|_| "it never fires".to_string())?;
    Ok(When::Cron(Box::new(cron)))
}

#[cfg(test)]
mod tests;
