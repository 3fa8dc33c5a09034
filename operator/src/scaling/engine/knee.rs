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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scaling::{Limit, ScalingSpec, Workers};

    /// Ticks `engine` every 5 s from `from` for `seconds`: `pods` pods of one slot,
    /// all busy with work queued, on a downstream serving 5 jobs at once, 1 s jobs
    /// alone; `pods: 1` is a light load instead (one job in flight, nothing waiting).
    fn run(
        engine: &mut Engine,
        spec: &ScalingSpec,
        pods: i32,
        from: u64,
        seconds: u64,
        done: &mut f64,
    ) -> Vec<crate::scaling::Decision> {
        let light = pods == 1;
        let stretch = (f64::from(pods) / 5.0).max(1.0);
        let mut decisions = Vec::new();
        for t in (from..from + seconds).step_by(5) {
            *done += 5.0 * f64::from(pods) / stretch;
            let obs = Observation {
                backlog: if light { 0 } else { 1000 },
                in_flight: pods as u64,
                processed_total: *done as u64,
                current_replicas: pods,
                ready_replicas: pods,
                job_seconds: Some(stretch),
                job_seconds_deviation: Some(stretch),
                ..Observation::default()
            };
            decisions.push(engine.tick(spec, &obs, Duration::from_secs(t)));
        }
        decisions
    }

    #[test]
    fn a_saturated_pool_is_capped_at_the_knee_and_its_decision_says_so() {
        let spec = ScalingSpec::default();
        let mut engine = Engine::new();
        let mut done = 0.0;
        // Light load: the jobs' own duration, 1 s.
        run(&mut engine, &spec, 1, 0, 600, &mut done);
        // Then 20 pods on a downstream serving 5: each job takes 4 s.
        let decisions = run(&mut engine, &spec, 20, 600, 300, &mut done);
        let last = decisions.last().expect("decisions");
        let saturation = last.saturation.expect("a knee");
        assert_eq!(saturation.knee, 5, "{saturation:?}");
        assert!((saturation.rate - 5.0).abs() < 0.5, "{saturation:?}");
        assert!(saturation.marginal < 0.05, "{saturation:?}");
        assert!(saturation.message().contains("above 5 pods"));
        // Pods above the knee go at once (a probe a pod above it at most), and the
        // reason says the knee held the count.
        assert!((5..=6).contains(&last.desired), "{last:?}");
        let capped = decisions
            .iter()
            .filter(|d| d.reason.limit == Some(Limit::Saturated))
            .count();
        assert!(capped > 0, "{decisions:?}");
        assert!(
            decisions
                .iter()
                .filter(|d| d.reason.limit == Some(Limit::Saturated))
                .all(|d| d.reason.code() == "Saturated"
                    && d.desired <= 6
                    && d.reason.message().contains("capped at the knee"))
        );
        // An unreadable queue keeps what was measured.
        assert_eq!(engine.tick_failed(&spec, 5).saturation, Some(saturation));
    }

    #[test]
    fn a_rate_limited_queue_has_no_knee() {
        let spec = ScalingSpec::default();
        let mut engine = Engine::new();
        engine.set_workers(Workers::new(Some("1000/s"), 1));
        let mut done = 0.0;
        run(&mut engine, &spec, 1, 0, 600, &mut done);
        let decisions = run(&mut engine, &spec, 20, 600, 300, &mut done);
        assert!(decisions.iter().all(|d| d.saturation.is_none()));
        assert!(
            decisions
                .iter()
                .all(|d| d.reason.limit != Some(Limit::Saturated))
        );
        assert!(decisions.last().is_some_and(|d| d.desired > 6));
    }
}
