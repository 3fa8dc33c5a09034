//! The workers' job durations, pooled by how many jobs were in flight: the
//! reference speed of a job slot, and the knee a fast-growing pool shows before any
//! sample at one size.

use super::{
    FORGET_AFTER, Knee, LEVEL_JOBS, MIN_SPAN, PERSIST, READING_JOBS, REFERENCE_JOBS,
    SATURATED_EFFICIENCY, Z,
};
use crate::scaling::{Observation, Saturation};

/// Job durations read at one level of jobs in flight, pooled: every reading (what a
/// job takes at that level, for the reference), and the readings taken while work
/// waited and the jobs in flight did not fall (for the stretch). As a pool drains, the
/// jobs still running are the long ones, and the readings then say more about which
/// jobs were left than about how fast they ran.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Level {
    pub(super) all: Pool,
    busy: Pool,
    at: f64,
}

/// Readings pooled.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Pool {
    /// Jobs the readings stand for.
    pub(super) jobs: f64,
    /// Their durations, summed (each reading times the jobs it stands for).
    seconds: f64,
    /// Their variances, summed the same way, from the workers' spread.
    variance: f64,
    /// Jobs of the readings that came with a spread.
    spread_jobs: f64,
    /// The jobs in flight, summed the same way.
    pub(super) in_flight: f64,
}

impl Level {
    /// The pooled mean of every reading and its upper bound, once it is a reference.
    pub(super) fn duration(&self) -> Option<(f64, f64)> {
        if self.all.jobs < REFERENCE_JOBS {
            return None;
        }
        let (mean, error) = self.all.mean();
        (mean > 0.0).then_some((mean, mean + Z * error))
    }
}

impl Pool {
    /// The pooled mean and its standard error.
    pub(super) fn mean(&self) -> (f64, f64) {
        let mean = self.seconds / self.jobs.max(f64::MIN_POSITIVE);
        let sd = if self.spread_jobs > 0.0 {
            (self.variance / self.spread_jobs).sqrt()
        } else {
            mean
        };
        (mean, sd / self.jobs.max(1.0).sqrt())
    }

    fn add(&mut self, jobs: f64, seconds: f64, in_flight: f64, sd: Option<f64>) {
        self.jobs += jobs;
        self.seconds += jobs * seconds;
        self.in_flight += jobs * in_flight;
        if let Some(sd) = sd {
            self.variance += jobs * sd * sd;
            self.spread_jobs += jobs;
        }
    }
}

impl Knee {
    /// A knee before any sample: the jobs took longer at [`PERSIST`] − 1 levels of jobs
    /// in flight above the reference's, each by more than its own error can explain
    /// (its pooled mean less [`Z`] standard errors, against the reference's upper bound
    /// over [`SATURATED_EFFICIENCY`]). A pool that grows fast, pods starting at every
    /// poll, gives no sample at one size until it stops; the durations its jobs took on
    /// the way up say it sooner. The knee is then the pods that complete, at the
    /// reference's speed, what the highest such level did (`in flight / duration`).
    ///
    /// The reference here is the lowest level with one full reading ([`READING_JOBS`]
    /// jobs, what one worker's average covers): its bound carries its own error, wide
    /// for so few jobs, so a level above must be stretched past that to count, and the
    /// levels above need [`LEVEL_JOBS`] each. A pool that meets its load cold and
    /// doubles at every poll leaves one reading at each level on the way up; asking
    /// the reference for more jobs put it at the pool's final size, past the knee,
    /// where no level above is left to show the stretch, and the pool stayed at
    /// `maxReplicas`.
    pub(super) fn stretched(&mut self, concurrency: i32, now: f64) {
        if self.found.is_some() {
            return;
        }
        let Some((base, (mean, upper))) = self.levels.iter().find_map(|(level, l)| {
            let (mean, error) = l.all.mean();
            (l.all.jobs >= READING_JOBS as f64 && mean > 0.0)
                .then_some((*level, (mean, mean + Z * error)))
        }) else {
            return;
        };
        // Each level stretched counts once, twice when stretched past twice the bound:
        // evidence that strong is worth two levels.
        let stretched: Vec<(&Pool, usize)> = self
            .levels
            .range(base + 1..)
            .map(|(_, l)| &l.busy)
            .filter(|l| l.jobs >= LEVEL_JOBS)
            .filter_map(|l| {
                let (m, error) = l.mean();
                let stretch = SATURATED_EFFICIENCY * (m - Z * error) / upper;
                (stretch > 1.0).then_some((l, 1 + usize::from(stretch > 2.0)))
            })
            .collect();
        let Some(&(top, _)) = stretched.last() else {
            return;
        };
        if stretched.iter().map(|(_, weight)| weight).sum::<usize>() + 1 < PERSIST as usize {
            return;
        }
        // What the pool completes now, over the last polls: past the knee, however
        // many run. The level's own `in flight / duration` reads high, the workers'
        // average lagging behind a pool that grows.
        let in_flight = top.in_flight / top.jobs;
        let rate = match (self.recent.front(), self.recent.back()) {
            (Some(&(from, first)), Some(&(to, last))) if to - from >= MIN_SPAN => {
                last.saturating_sub(first) as f64 / (to - from)
            }
            _ => return,
        };
        let per_pod = f64::from(concurrency) / mean;
        self.found = Some(Saturation {
            knee: ((rate / per_pod - 0.05).ceil() as i32).max(1),
            rate,
            measured_at: (in_flight / f64::from(concurrency)).ceil() as i32,
            marginal: 0.0,
            confirmed_at: now,
            climbing: false,
        });
    }

    /// Pools the workers' duration reading at the level of jobs in flight since the
    /// last poll (the higher of the two polls' counts: a reading put too high is
    /// never the reference).
    pub(super) fn read_duration(&mut self, obs: &Observation, now: f64) {
        if self
            .recent
            .back()
            .is_some_and(|&(_, done)| done > obs.processed_total)
        {
            self.recent.clear();
        }
        self.recent.push_back((now, obs.processed_total));
        while self.recent.len() > 2 && self.recent[1].0 <= now - MIN_SPAN {
            self.recent.pop_front();
        }
        let last = self
            .last
            .replace((obs.processed_total, obs.in_flight, obs.backlog));
        let Some((processed, in_flight, backlog)) = last else {
            return;
        };
        let Some(seconds) = obs.job_seconds.filter(|s| s.is_finite() && *s > 0.0) else {
            return;
        };
        let done = obs.processed_total.saturating_sub(processed);
        if done == 0 || obs.processed_total < processed {
            return;
        }
        let jobs = done.min(READING_JOBS) as f64;
        let busy = backlog > 0 && obs.backlog > 0 && obs.in_flight >= in_flight;
        let in_flight = in_flight.max(obs.in_flight).max(1);
        let level = in_flight.ilog2();
        self.levels.retain(|_, l| now - l.at <= FORGET_AFTER);
        let entry = self.levels.entry(level).or_default();
        let sd = obs
            .job_seconds_deviation
            .filter(|d| d.is_finite() && *d >= 0.0);
        entry.all.add(jobs, seconds, in_flight as f64, sd);
        if busy {
            entry.busy.add(jobs, seconds, in_flight as f64, sd);
        }
        entry.at = now;
    }
}
