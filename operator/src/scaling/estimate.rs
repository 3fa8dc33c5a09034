//! Rates measured from counters: arrivals, completions, and what one replica can process;
//! and how long a new replica takes to become ready.

use std::collections::VecDeque;

/// How quickly the smoothed rates follow a change, in seconds (the time constant of an
/// exponentially weighted moving average whose weight depends on the time between samples,
/// so a missed sample weighs as much as the time it covers).
const ARRIVAL_TAU: f64 = 30.0;
const COMPLETION_TAU: f64 = 30.0;
const THROUGHPUT_TAU: f64 = 60.0;
/// The span of the sustained arrival rate's median, in seconds.
const SUSTAINED_WINDOW: f64 = 60.0;

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: f64,
    processed: u64,
    pending: u64,
    backlog: u64,
    in_flight: u64,
    ready: i32,
}

/// Smoothed rates estimated from the monotonic `processed_total` counter and queue depths.
///
/// - arrivals per second are derived by conservation of work: what was completed plus what
///   the queue and the workers gained, `(Δprocessed + Δ(backlog + inFlight)) / Δt`;
/// - per-replica throughput is measured only over intervals when the workers were
///   saturated (jobs waiting at both ends), since an idle worker's rate says nothing about
///   its capacity, and only once the ready count has been steady for two job durations
///   (estimated by Little's law as inFlight / completions per second): a pod that just
///   became ready has not completed anything yet, and a removed pod still completes the
///   jobs it drains, so rates right after a change misjudge capacity, and an
///   underestimate would feed on itself (fewer jobs per pod, more pods, more new pods);
/// - a counter that goes backwards (a reset) starts a new baseline without a rate update.
#[derive(Clone, Debug, Default)]
pub struct RateEstimator {
    last: Option<Sample>,
    arrival: Option<f64>,
    /// Recent intervals' arrival rates: when each ended, how long it was, its rate.
    recent_arrivals: VecDeque<(f64, f64, f64)>,
    completion: Option<f64>,
    per_replica: Option<f64>,
    job_seconds: Option<f64>,
    ready_changed_at: Option<f64>,
}

impl RateEstimator {
    /// Smoothed arrivals per second, once two samples were seen.
    pub fn arrival_rate(&self) -> Option<f64> {
        self.arrival
    }

    /// Sustained arrivals per second: the time-weighted median of the arrival rates of the
    /// intervals within the last [`SUSTAINED_WINDOW`] seconds. A burst shorter than half the
    /// window does not move it.
    pub fn sustained_arrival_rate(&self) -> Option<f64> {
        let mut rates: Vec<(f64, f64)> = self
            .recent_arrivals
            .iter()
            .map(|&(_, dt, rate)| (rate, dt))
            .collect();
        if rates.is_empty() {
            return None;
        }
        rates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = rates.iter().map(|r| r.1).sum();
        let mut seen = 0.0;
        for (i, &(rate, dt)) in rates.iter().enumerate() {
            seen += dt;
            if seen > total / 2.0 + 1e-9 {
                return Some(rate);
            }
            if (seen - total / 2.0).abs() <= 1e-9 {
                let next = rates.get(i + 1).map_or(rate, |r| r.0);
                return Some((rate + next) / 2.0);
            }
        }
        rates.last().map(|r| r.0)
    }

    /// Smoothed completions per second across all replicas.
    pub fn completion_rate(&self) -> Option<f64> {
        self.completion
    }

    /// Smoothed jobs per second that one saturated replica completes.
    pub fn per_replica_throughput(&self) -> Option<f64> {
        self.per_replica
    }

    /// Smoothed seconds one job takes, by Little's law: jobs in flight over
    /// completions per second. Holds whether the workers are saturated or
    /// held back by a rate limit.
    pub fn job_seconds(&self) -> Option<f64> {
        self.job_seconds
    }

    /// Adds a sample taken at `at` seconds.
    pub fn observe(&mut self, at: f64, processed: u64, backlog: u64, in_flight: u64, ready: i32) {
        let sample = Sample {
            at,
            processed,
            pending: backlog.saturating_add(in_flight),
            backlog,
            in_flight,
            ready,
        };
        let Some(last) = self.last else {
            self.last = Some(sample);
            return;
        };
        let dt = at - last.at;
        if dt.is_nan() || dt <= 0.0 {
            // Same instant or time went backwards: nothing to learn, keep the older baseline.
            return;
        }
        self.last = Some(sample);
        if processed < last.processed {
            return;
        }
        let done = (processed - last.processed) as f64;
        let gained = sample.pending as f64 - last.pending as f64;
        let arrival = ((done + gained) / dt).max(0.0);
        let completion = done / dt;
        self.arrival = Some(smooth(self.arrival, arrival, dt, ARRIVAL_TAU));
        self.recent_arrivals.push_back((at, dt, arrival));
        while self.recent_arrivals.front().is_some_and(|&(end, dt, _)| {
            end - dt < at - SUSTAINED_WINDOW && self.recent_arrivals.len() > 1
        }) {
            self.recent_arrivals.pop_front();
        }
        self.completion = Some(smooth(self.completion, completion, dt, COMPLETION_TAU));
        let busy = (last.in_flight + in_flight) as f64 / 2.0;
        if done > 0.0 && busy > 0.0 {
            self.job_seconds = Some(smooth(
                self.job_seconds,
                busy / completion,
                dt,
                THROUGHPUT_TAU,
            ));
        }
        if ready != last.ready {
            self.ready_changed_at = Some(at);
            return;
        }
        let settle = 2.0 * self.job_seconds.unwrap_or(0.0);
        let settled = self
            .ready_changed_at
            .is_none_or(|changed| last.at - changed >= settle);
        if settled && last.backlog > 0 && sample.backlog > 0 && ready > 0 && done > 0.0 {
            let measured = completion / f64::from(ready);
            self.per_replica = Some(smooth(self.per_replica, measured, dt, THROUGHPUT_TAU));
        }
    }
}

/// How long a new replica takes to become ready, measured from the scale-ups that were
/// applied: the time from each scale-up until the ready count first reaches its new size.
///
/// Samples are taken at the engine's polls, so they include up to one poll interval of
/// delay: what the engine needs is when it will see the pods ready, not the kubelet's
/// timestamp. A scale-down before the pods were ready lowers the count waited for; pods that
/// never become ready (an image that cannot be pulled) stop being waited for after
/// [`STARTUP_GIVE_UP_SECONDS`] and leave no sample.
#[derive(Clone, Debug, Default)]
pub struct StartupEstimator {
    /// Applied scale-ups still waiting for their pods: when, and the count to reach.
    waiting: Vec<(f64, i32)>,
    seconds: Option<f64>,
}

/// Pods not ready this long after their scale-up are no longer waited for.
pub const STARTUP_GIVE_UP_SECONDS: f64 = 600.0;
/// The weight of a new start-up sample.
const STARTUP_WEIGHT: f64 = 0.5;

impl StartupEstimator {
    /// The smoothed start-up time in seconds, once one scale-up has become ready.
    pub fn seconds(&self) -> Option<f64> {
        self.seconds
    }

    /// Takes `seconds` as the start-up time when none has been measured yet: the one a
    /// previous engine measured for the same pool (kept in its status), so that a
    /// restarted operator sizes new pods right from its first decision. A measure
    /// taken since is kept, and later ones are smoothed into the seed as usual.
    pub fn seed(&mut self, seconds: f64) {
        if self.seconds.is_none() && seconds.is_finite() && seconds >= 0.0 {
            self.seconds = Some(seconds);
        }
    }

    /// A scale-up from `from` to `to` replicas was applied at `at`.
    pub fn scaled(&mut self, at: f64, from: i32, to: i32) {
        if to > from {
            self.waiting.push((at, to));
        }
    }

    /// What a poll at `at` saw: `current` replicas, `ready` of them ready.
    pub fn observe(&mut self, at: f64, current: i32, ready: i32) {
        let mut seconds = self.seconds;
        self.waiting.retain_mut(|(since, count)| {
            *count = (*count).min(current);
            if at - *since > STARTUP_GIVE_UP_SECONDS {
                return false;
            }
            if ready >= *count {
                let sample = (at - *since).max(0.0);
                seconds = Some(match seconds {
                    None => sample,
                    Some(previous) => previous + STARTUP_WEIGHT * (sample - previous),
                });
                return false;
            }
            true
        });
        self.seconds = seconds;
    }
}

fn smooth(previous: Option<f64>, value: f64, dt: f64, tau: f64) -> f64 {
    match previous {
        None => value,
        Some(previous) => {
            let weight = 1.0 - (-dt / tau).exp();
            previous + weight * (value - previous)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_arrivals_from_completions_and_queue_growth() {
        let mut e = RateEstimator::default();
        e.observe(0.0, 100, 10, 2, 2);
        // 20 done and the queue grew by 10 in 10 s: 3 jobs/s arrived.
        e.observe(10.0, 120, 20, 2, 2);
        assert_eq!(e.arrival_rate(), Some(3.0));
        assert_eq!(e.completion_rate(), Some(2.0));
        assert_eq!(e.per_replica_throughput(), Some(1.0));
    }

    #[test]
    fn ignores_throughput_while_workers_are_not_saturated() {
        let mut e = RateEstimator::default();
        e.observe(0.0, 0, 0, 1, 4);
        e.observe(10.0, 10, 0, 1, 4);
        assert_eq!(e.per_replica_throughput(), None);
        assert_eq!(e.arrival_rate(), Some(1.0));
    }

    #[test]
    fn a_counter_reset_starts_a_new_baseline() {
        let mut e = RateEstimator::default();
        e.observe(0.0, 1000, 5, 0, 1);
        e.observe(5.0, 3, 5, 0, 1);
        assert_eq!(e.arrival_rate(), None);
        e.observe(10.0, 8, 5, 0, 1);
        assert_eq!(e.arrival_rate(), Some(1.0));
    }

    #[test]
    fn a_missed_sample_weighs_as_much_as_the_time_it_covers() {
        let mut short = RateEstimator::default();
        short.observe(0.0, 0, 0, 0, 1);
        short.observe(5.0, 0, 0, 0, 1);
        short.observe(10.0, 100, 0, 0, 1);
        let mut long = RateEstimator::default();
        long.observe(0.0, 0, 0, 0, 1);
        long.observe(5.0, 0, 0, 0, 1);
        long.observe(300.0, 3000, 0, 0, 1);
        let (Some(short), Some(long)) = (short.arrival_rate(), long.arrival_rate()) else {
            panic!("both have rates");
        };
        // 5 s of 20 jobs/s moves the estimate a little; 295 s of 10.17 jobs/s nearly all the way.
        assert!(short < 4.0, "{short}");
        assert!(long > 10.0, "{long}");
    }

    #[test]
    fn throughput_waits_for_new_pods_to_settle() {
        let mut e = RateEstimator::default();
        // 2 pods, 10 s jobs, 2 slots each: 0.2 jobs/s per pod; inFlight 4.
        e.observe(0.0, 0, 50, 4, 2);
        e.observe(10.0, 4, 50, 4, 2);
        assert_eq!(e.per_replica_throughput(), Some(0.2));
        // Two more pods become ready; their first jobs finish only 10 s later.
        e.observe(15.0, 6, 50, 8, 4);
        e.observe(20.0, 8, 50, 8, 4);
        e.observe(25.0, 10, 50, 8, 4);
        assert_eq!(e.per_replica_throughput(), Some(0.2), "not settled yet");
        // Sampling resumes once an interval starts two job durations after the change.
        e.observe(45.0, 26, 50, 8, 4);
        e.observe(50.0, 30, 50, 8, 4);
        let Some(rate) = e.per_replica_throughput() else {
            panic!("known")
        };
        assert!((rate - 0.2).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn a_short_burst_does_not_move_the_sustained_arrival_rate_a_lasting_change_does() {
        let mut e = RateEstimator::default();
        let mut processed = 0;
        let mut at = 0.0;
        let mut poll = |e: &mut RateEstimator, arrived: u64| {
            // Everything that arrives is done within the interval.
            processed += arrived;
            at += 5.0;
            e.observe(at, processed, 0, 0, 1);
        };
        for _ in 0..12 {
            poll(&mut e, 10);
        }
        assert_eq!(e.sustained_arrival_rate(), Some(2.0));
        // 500 jobs in one interval: the smoothed rate jumps, the sustained one does not.
        poll(&mut e, 500);
        assert_eq!(e.sustained_arrival_rate(), Some(2.0));
        assert!(e.arrival_rate().is_some_and(|rate| rate > 10.0));
        // Four times the traffic for more than half a minute is the new rate.
        for _ in 0..7 {
            poll(&mut e, 40);
        }
        assert_eq!(e.sustained_arrival_rate(), Some(8.0));
    }

    #[test]
    fn start_up_is_measured_from_each_applied_scale_up_until_its_pods_are_ready() {
        let mut s = StartupEstimator::default();
        s.observe(0.0, 1, 1);
        assert_eq!(s.seconds(), None);
        s.scaled(0.0, 1, 5);
        s.observe(5.0, 5, 1);
        s.observe(10.0, 5, 3);
        assert_eq!(s.seconds(), None, "not all five yet");
        s.observe(20.0, 5, 5);
        assert_eq!(s.seconds(), Some(20.0));
        // The next one takes 10 s: the estimate moves halfway.
        s.scaled(30.0, 5, 6);
        s.observe(40.0, 6, 6);
        assert_eq!(s.seconds(), Some(15.0));
    }

    #[test]
    fn a_seed_stands_until_measured_and_never_replaces_a_measure() {
        let mut s = StartupEstimator::default();
        s.seed(f64::NAN);
        s.seed(-1.0);
        assert_eq!(s.seconds(), None, "no nonsense seed");
        s.seed(20.0);
        assert_eq!(s.seconds(), Some(20.0));
        // A scale-up that takes 10 s moves it halfway, as a measure would.
        s.scaled(0.0, 1, 2);
        s.observe(10.0, 2, 2);
        assert_eq!(s.seconds(), Some(15.0));
        s.seed(40.0);
        assert_eq!(s.seconds(), Some(15.0), "the measure stays");
    }

    #[test]
    fn a_scale_down_before_readiness_lowers_the_count_waited_for() {
        let mut s = StartupEstimator::default();
        s.scaled(0.0, 0, 10);
        s.observe(5.0, 4, 0);
        s.observe(15.0, 4, 4);
        assert_eq!(s.seconds(), Some(15.0));
    }

    #[test]
    fn pods_that_never_become_ready_are_given_up_without_a_sample() {
        let mut s = StartupEstimator::default();
        s.scaled(0.0, 0, 2);
        s.observe(STARTUP_GIVE_UP_SECONDS + 1.0, 2, 0);
        s.observe(STARTUP_GIVE_UP_SECONDS + 5.0, 2, 2);
        assert_eq!(s.seconds(), None);
    }

    #[test]
    fn time_going_backwards_is_ignored() {
        let mut e = RateEstimator::default();
        e.observe(10.0, 0, 0, 0, 1);
        e.observe(5.0, 50, 0, 0, 1);
        e.observe(20.0, 10, 0, 0, 1);
        assert_eq!(e.arrival_rate(), Some(1.0));
    }
}
