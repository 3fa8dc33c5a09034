//! The rate cap: a queue with a rate limit (`spec.worker.rateLimit`) needs no more
//! workers than the limit keeps busy, since any more would only wait for it. The cap
//! is sized from the workers' settings ([`Workers`]) and the job duration, at a wake as
//! at any size, and the scale-down window does not hold the pool above it.

use workerpool_queue::rate::RateLimit;

use super::{Engine, ceil};
use crate::scaling::{Observation, RateCap};

/// What the workers' settings tell the engine: the queue's rate limit (if
/// any) and the jobs each worker runs at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// At most this many job starts per period across the pool.
    pub rate_limit: Option<RateLimit>,
    /// Jobs one worker runs at once.
    pub concurrency: i32,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            rate_limit: None,
            concurrency: 1,
        }
    }
}

impl Workers {
    /// From `spec.worker`: its `rateLimit` as written (one that does not
    /// parse, which the CRD's rule refuses, counts as none) and its
    /// `concurrency`.
    pub fn new(rate_limit: Option<&str>, concurrency: i32) -> Self {
        Workers {
            rate_limit: rate_limit.and_then(|r| r.parse().ok()),
            concurrency: concurrency.max(1),
        }
    }

    /// The most workers the rate limit keeps busy when one job takes
    /// `job_seconds` on average, with this standard `deviation` when the
    /// workers measured it: by Little's law `J = rate × job_seconds` jobs
    /// run at once at the limit, on average, and the count in flight varies
    /// around `J`. A pool sized for the mean alone would often have no free
    /// slot when the limit allows a start, and a start missed is lost; so
    /// the cap is `ceil((J + √(J·s)) / concurrency) + 1`, plus one for the
    /// estimate's error and the moment between a slot freeing and the next
    /// start. `None` without a limit.
    ///
    /// `s` is how much the count in flight varies, per job in flight. At
    /// the limit the bucket spaces the starts evenly (GCRA), so with
    /// durations `D` the count's variance is `rate × E|D₁ − D₂| / 2`
    /// (over the phase of the starts: `∫ P(D > t)·P(D ≤ t) dt` per start
    /// interval), that is `J` times the durations' Gini coefficient: 0 for
    /// jobs of a fixed length, ½ for exponential ones, never above 1. The
    /// workers keep the mean and the spread, not the Gini coefficient, so
    /// the bound `E|D₁ − D₂| ≤ σ√2` (Cauchy–Schwarz) gives
    /// `s = min(1, σ / (√2 · mean))`. Without a measured spread `s = 1`,
    /// the most any duration has (and Poisson starts' `√J`: the
    /// square-root staffing rule).
    pub fn busy_at_limit(&self, job_seconds: f64, deviation: Option<f64>) -> Option<i32> {
        let rate = self.rate_limit?.per_second();
        let seconds = job_seconds.max(0.0);
        let spread = match deviation {
            Some(d) if d.is_finite() && d >= 0.0 && seconds > 0.0 => {
                (d / (std::f64::consts::SQRT_2 * seconds)).min(1.0)
            }
            _ => 1.0,
        };
        let jobs = rate * seconds;
        let busy = (jobs + (jobs * spread).sqrt()) / f64::from(self.concurrency.max(1));
        Some(ceil(busy).saturating_add(1))
    }
}

impl Engine {
    /// The most workers the rate limit keeps busy at this tick ([`Workers::busy_at_limit`]),
    /// `None` without a limit or a job duration to size it on.
    pub(super) fn busy_at_limit(&self, obs: &Observation) -> Option<i32> {
        // More workers than the rate limit keeps busy would only wait for it. The cap
        // is sized on the longer of the two job durations the engine has: the workers'
        // measure kept in Redis, there from the first decision on (after a restart, a
        // leader change or an idle spell), and the engine's own Little's-law estimate
        // smoothed over a minute. A cap too low loses starts the limit allows, one too
        // high only keeps a worker waiting. Until either is known there is nothing to
        // size the cap on.
        self.cap_job_seconds(obs)
            .and_then(|seconds| self.workers.busy_at_limit(seconds, self.job_deviation(obs)))
    }

    /// The cap on a proposal of `largest` replicas, when the rate limit keeps fewer busy.
    pub(super) fn rate_cap(&self, busy_at_limit: Option<i32>, largest: i32) -> Option<RateCap> {
        busy_at_limit
            .filter(|cap| largest > *cap)
            .zip(self.workers.rate_limit)
            .map(|(workers, limit)| RateCap { limit, workers })
    }
}
