//! The knee, applied: a pool whose completions stopped rising with its size
//! ([`crate::scaling::Knee`] measures where) runs no more pods than the knee, but for a
//! probe above it now and then while work waits, and the scale-down window does not
//! hold it above the knee: those pods only spread the waiting for what the jobs share.
//! A queue with a rate limit has no knee: the limit already flattens its completions,
//! and the rate cap sizes it.

use super::Engine;
use crate::scaling::{Observation, Saturation};

impl Engine {
    /// Feeds the measure one tick's observation (after deciding, as the rates are).
    pub(super) fn measure_knee(&mut self, obs: &Observation, now: f64) {
        if self.workers.rate_limit.is_some() {
            self.knee = Default::default();
            return;
        }
        self.knee.observe(obs, self.workers.concurrency, now);
    }

    /// The most pods the knee allows now, when one was measured: the knee, or a
    /// probe above it while `wanted` is more and work waits.
    pub(super) fn knee_ceiling(&mut self, obs: &Observation, wanted: i32, now: f64) -> Option<i32> {
        if self.workers.rate_limit.is_some() {
            return None;
        }
        let startup = self.startup.seconds().unwrap_or(0.0);
        self.knee.cap(wanted, obs.backlog, startup, now)
    }

    /// The knee measured, while the pool is saturated (none with a rate limit).
    pub fn saturation(&self) -> Option<Saturation> {
        if self.workers.rate_limit.is_some() {
            return None;
        }
        self.knee.saturation()
    }
}
