//! What the engine reads from an observation, beyond its counts: whether the pool
//! worked since the last poll, how long one job takes (the workers' measure kept in
//! Redis, else the engine's own estimate), how much the durations spread, and how old
//! the oldest waiting job is. Every rule that needs one of these asks here, so that
//! they all read it the same way.

use super::Engine;
use crate::scaling::Observation;

impl Engine {
    /// Whether the pool had work since the last poll, and remembers this poll's count
    /// of completed jobs for the next.
    pub(super) fn worked(&mut self, obs: &Observation) -> bool {
        // Work since the last poll: jobs waiting or running now, or completed since.
        let completed = self
            .last_processed
            .is_some_and(|last| last != obs.processed_total);
        self.last_processed = Some(obs.processed_total);
        obs.pending() || completed
    }

    /// Whether the engine cannot yet tell how much work the backlog holds: no job has
    /// been timed, by the engine or by the workers (the duration kept in Redis).
    pub(super) fn blind(&self, obs: &Observation) -> bool {
        self.job_seconds(obs).is_none()
    }

    /// Seconds one job takes: the workers' own measure kept in Redis (every job timed),
    /// else the engine's estimate (Little's law on the polls' in-flight counts, smoothed
    /// over a minute), which a few polls' samples of a light load make coarse.
    pub(super) fn job_seconds(&self, obs: &Observation) -> Option<f64> {
        obs.job_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .or(self.rates.job_seconds())
            .filter(|s| s.is_finite() && *s > 0.0)
    }

    /// The standard deviation of the job durations, as the workers measured it, scaled
    /// to the duration the rate cap is sized on (the spread is the workers' measure's,
    /// and a longer estimate stretches it in proportion).
    pub(super) fn job_deviation(&self, obs: &Observation) -> Option<f64> {
        let kept = obs.job_seconds.filter(|s| s.is_finite() && *s > 0.0)?;
        let deviation = obs
            .job_seconds_deviation
            .filter(|d| d.is_finite() && *d >= 0.0)?;
        let sized_on = self.cap_job_seconds(obs)?;
        Some(deviation * sized_on / kept)
    }

    /// The job duration the rate cap is sized on: the longer of the workers' measure
    /// and the engine's estimate.
    pub(super) fn cap_job_seconds(&self, obs: &Observation) -> Option<f64> {
        let valid = |s: &f64| s.is_finite() && *s > 0.0;
        match (
            obs.job_seconds.filter(valid),
            self.rates.job_seconds().filter(valid),
        ) {
            (Some(kept), Some(estimated)) => Some(kept.max(estimated)),
            (kept, estimated) => kept.or(estimated),
        }
    }

    /// The oldest waiting job's age: measured when producers stamp it, else estimated by
    /// Little's law as backlog / completions per second.
    pub(super) fn oldest_age(&self, obs: &Observation) -> Option<f64> {
        if let Some(age) = obs.oldest_job_age_seconds {
            return Some(age.max(0.0));
        }
        if obs.backlog == 0 {
            return Some(0.0);
        }
        match self.rates.completion_rate() {
            Some(rate) if rate > 0.0 => Some(obs.backlog as f64 / rate),
            _ => None,
        }
    }
}
