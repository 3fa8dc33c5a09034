//! The knee: where one more pod stops raising completions.
//!
//! The engine sizes a pool on the work left and the job duration. When the jobs share
//! something that saturates (a database's connection pool, an external API's limit),
//! each job takes longer as more run, so that rule adds pods that only spread the
//! waiting, up to `maxReplicas`, and the pool hammers what is already the bottleneck.
//! This room measures instead.
//!
//! - **What the pool does.** While every ready pod's slots are busy and work is still
//!   queued, completions per second are the pool's capacity, not the arrivals. Over a
//!   [`MIN_SPAN`] at one size, with at least [`MIN_COMPLETIONS`], that is one sample:
//!   `X` at `m` pods (smoothed with the earlier samples at that size).
//! - **What a pod can do.** The best completions per pod measured at a smaller size,
//!   `p`: what a pod does when fewer share what the jobs call. Measured, not derived
//!   from the job duration, whose mean over a few jobs is too noisy to judge by.
//! - **The knee.** Pods doing less than [`SATURATED_EFFICIENCY`] of that
//!   (`X < 0.6 · m · p`: adding pods bought little) are waiting on something else: the
//!   pool is saturated, and `ceil(X / p)` pods at that speed would complete as much.
//!   That is the knee: the engine adds no pods above it and releases those above it.
//!   The threshold is low on purpose: a false knee holds a pool back, and sampling
//!   noise must not make one; a pool only mildly past its knee is sized as before.
//! - **Probing.** The knee moves when the downstream recovers (or degrades). Every
//!   [`PROBE_EVERY`] while work waits, the engine may go a quarter above it (one pod at
//!   least); a sample there at full speed raises the knee to it, and one still
//!   saturated sets it from its own `X`. A knee nothing has confirmed for
//!   [`FORGET_AFTER`] is forgotten.
//!
//! Not yet applied by the engine: see docs/scaling.md, "A downstream the jobs share",
//! for what held it back.
//!
//! This is TCP Vegas's comparison of expected and actual throughput (Brakmo and
//! Peterson, 1994: with `BaseRTT` the least round trip seen, `Expected = cwnd / BaseRTT`,
//! and a sender whose `Actual` falls short of it is only filling queues) with the pod as
//! the window; the probe above the limit is the additive probe of Netflix's
//! concurrency-limits (its `VegasLimit` and `GradientLimit` grow the limit while latency
//! holds and cut it when it climbs).

use std::collections::BTreeMap;

use super::Observation;

/// The least time at one size, all slots busy and work queued, for a sample.
pub const MIN_SPAN: f64 = 15.0;
/// The fewest completions a sample counts: with fewer, its noise (about one over
/// the square root of the count) could pass for saturation.
pub const MIN_COMPLETIONS: u64 = 100;
/// How much a new sample at a size moves the one kept for it.
pub const SMOOTHING: f64 = 0.5;
/// Busy slots over all ready slots at which a pool is busy enough to be measured.
pub const BUSY: f64 = 0.9;
/// Below this share of what its pods can do, a pool is saturated.
pub const SATURATED_EFFICIENCY: f64 = 0.6;
/// At or above this share, a probe's pods were all of use.
pub const FULL_EFFICIENCY: f64 = 0.9;
/// How often the engine probes above a knee while work waits.
pub const PROBE_EVERY: f64 = 300.0;
/// A knee no sample has confirmed for this long is forgotten.
pub const FORGET_AFTER: f64 = 3600.0;

/// A measured knee, as the pool's status shows it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Saturation {
    /// Pods past which one more adds little.
    pub knee: i32,
    /// Completions a second measured while saturated.
    pub rate: f64,
    /// Pods the pool had when it was measured.
    pub measured_at: i32,
    /// What each pod above the knee added, as a share of the knee's rate (0.004:
    /// 0.4 % more per pod added).
    pub marginal: f64,
    /// When it was last confirmed (seconds on the engine's clock).
    pub confirmed_at: f64,
}

impl Saturation {
    /// "completions flat at ~180 jobs/s above 12 pods (0.4 % more per pod added)".
    pub fn message(&self) -> String {
        format!(
            "completions flat at ~{} jobs/s above {} pod{} ({:.1} % more per pod added, measured at {} pods)",
            shown_rate(self.rate),
            self.knee,
            if self.knee == 1 { "" } else { "s" },
            100.0 * self.marginal.max(0.0),
            self.measured_at
        )
    }
}

fn shown_rate(rate: f64) -> String {
    if rate >= 10.0 {
        format!("{rate:.0}")
    } else {
        format!("{rate:.2}")
    }
}

/// A span at one size being measured.
#[derive(Clone, Copy, Debug)]
struct Span {
    ready: i32,
    since: f64,
    processed: u64,
}

/// What the engine keeps to find the knee. Pure: fed one observation a tick.
#[derive(Clone, Debug, Default)]
pub struct Knee {
    /// The span being measured, while the pool stays busy at one size.
    span: Option<Span>,
    /// The knee, once measured.
    found: Option<Saturation>,
    /// When the last probe above the knee began.
    probed_at: Option<f64>,
    /// Samples by size, for the marginal rate: completions a second, and when.
    rates: BTreeMap<i32, (f64, f64)>,
}

impl Knee {
    /// Folds one tick's observation in; `concurrency` is the jobs one pod runs.
    pub fn observe(&mut self, obs: &Observation, concurrency: i32, now: f64) {
        if self
            .found
            .is_some_and(|f| now - f.confirmed_at > FORGET_AFTER)
        {
            self.found = None;
            self.probed_at = None;
        }
        let slots = f64::from(obs.ready_replicas.max(0)) * f64::from(concurrency.max(1));
        let busy = obs.ready_replicas > 0
            && obs.ready_replicas == obs.current_replicas
            && obs.backlog > 0
            && obs.in_flight as f64 >= BUSY * slots;
        if !busy {
            self.span = None;
            return;
        }
        let span = match self.span {
            Some(s) if s.ready == obs.ready_replicas && obs.processed_total >= s.processed => s,
            _ => {
                self.span = Some(Span {
                    ready: obs.ready_replicas,
                    since: now,
                    processed: obs.processed_total,
                });
                return;
            }
        };
        let done = obs.processed_total - span.processed;
        let elapsed = now - span.since;
        if elapsed < MIN_SPAN || done < MIN_COMPLETIONS {
            return;
        }
        self.span = Some(Span {
            ready: obs.ready_replicas,
            since: now,
            processed: obs.processed_total,
        });
        let _ = concurrency;
        self.sample(obs.ready_replicas, done as f64 / elapsed, now);
    }

    /// One sample: `rate` completions a second at `pods`, all busy.
    fn sample(&mut self, pods: i32, rate: f64, now: f64) {
        self.rates.retain(|_, (_, at)| now - *at <= FORGET_AFTER);
        let rate = match self.rates.get(&pods) {
            Some(&(old, _)) => old + SMOOTHING * (rate - old),
            None => rate,
        };
        self.rates.insert(pods, (rate, now));
        let Some(per_pod) = self.per_pod_below(pods) else {
            return;
        };
        let efficiency = rate / (f64::from(pods) * per_pod);
        if efficiency < SATURATED_EFFICIENCY {
            // Within 5 % of a whole pod counts as that pod: the rates are measured.
            let knee = ((rate / per_pod - 0.05).ceil() as i32).max(1);
            self.found = Some(Saturation {
                knee,
                rate,
                measured_at: pods,
                marginal: self.marginal(knee, per_pod),
                confirmed_at: now,
            });
        } else if let Some(found) = self.found.as_mut() {
            if pods > found.knee && efficiency >= FULL_EFFICIENCY {
                // A probe's pods were all of use: the downstream has room again.
                found.knee = pods;
                found.rate = rate;
                found.measured_at = pods;
                found.confirmed_at = now;
            } else if pods <= found.knee {
                found.confirmed_at = now;
            }
        }
    }

    /// The most one pod completed a second at a size below `pods`, once measured.
    fn per_pod_below(&self, pods: i32) -> Option<f64> {
        self.rates
            .range(..pods)
            .map(|(&size, &(rate, _))| rate / f64::from(size.max(1)))
            .max_by(f64::total_cmp)
            .filter(|p| *p > 0.0)
    }

    /// What each pod above `knee` added, as a share of the knee's rate: between the
    /// smallest and the largest size measured above it when there are two, else
    /// between what `knee` pods at full speed (`per_pod` each) would complete and the
    /// largest size measured.
    fn marginal(&self, knee: i32, per_pod: f64) -> f64 {
        let mut above = self.rates.range(knee + 1..);
        let first = above.next();
        let last = above.next_back();
        let (from, to) = match (first, last) {
            (Some((&a, &(ra, _))), Some((&b, &(rb, _)))) => ((a, ra), (b, rb)),
            (Some((&b, &(rb, _))), None) => {
                let at_knee = (f64::from(knee) * per_pod).min(rb);
                ((knee, at_knee), (b, rb))
            }
            _ => return 0.0,
        };
        let base = from.1.max(f64::MIN_POSITIVE);
        ((to.1 - from.1) / f64::from(to.0 - from.0).max(1.0) / base).max(0.0)
    }

    /// The knee measured, if the pool is saturated.
    pub fn saturation(&self) -> Option<Saturation> {
        self.found
    }

    /// The most pods the engine should ask for now: the knee, or a quarter above it
    /// (one pod at least) while a probe runs; `None` without a knee. A probe starts
    /// when `wanted` (what the engine would ask for without the knee) is above it,
    /// work waits, and the last one is [`PROBE_EVERY`] old.
    pub fn cap(&mut self, wanted: i32, backlog: u64, startup: f64, now: f64) -> Option<i32> {
        let found = self.found?;
        let step = (found.knee / 4).max(1);
        if wanted <= found.knee || backlog == 0 {
            return Some(found.knee);
        }
        let probing = match self.probed_at {
            // Long enough for the pods to start and a sample to be taken.
            Some(at) if now - at < startup + 3.0 * MIN_SPAN => true,
            Some(at) if now - at < PROBE_EVERY => false,
            _ => {
                self.probed_at = Some(now);
                true
            }
        };
        Some(if probing {
            found.knee + step
        } else {
            found.knee
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `pods` pods of `concurrency` slots, all busy with work queued,
    /// `done` jobs completed so far, jobs of `job_seconds` mean duration.
    fn busy(pods: i32, concurrency: i32, done: u64, job_seconds: f64) -> Observation {
        Observation {
            backlog: 1000,
            in_flight: (pods * concurrency) as u64,
            processed_total: done,
            current_replicas: pods,
            ready_replicas: pods,
            job_seconds: Some(job_seconds),
            ..Observation::default()
        }
    }

    /// A pool of `pods` pods of `concurrency` slots on a downstream serving
    /// `capacity` jobs at once (processor sharing), jobs of `d` seconds alone.
    #[derive(Clone, Copy)]
    struct Pool {
        pods: i32,
        concurrency: i32,
        capacity: f64,
        d: f64,
    }

    impl Pool {
        fn of(pods: i32, concurrency: i32, capacity: f64, d: f64) -> Self {
            Pool {
                pods,
                concurrency,
                capacity,
                d,
            }
        }
    }

    /// Feeds `pool` from `from`, a tick every 5 s, for `samples` samples' worth of
    /// completions (and a span more); returns when it ended.
    fn run(knee: &mut Knee, pool: Pool, from: f64, samples: u32, done: &mut f64) -> f64 {
        let Pool {
            pods,
            concurrency,
            capacity,
            d,
        } = pool;
        let in_service = f64::from(pods * concurrency);
        let stretch = (in_service / capacity).max(1.0);
        let rate = in_service / (d * stretch);
        let per_sample = (MIN_COMPLETIONS as f64 / rate).max(MIN_SPAN) + 5.0;
        let seconds = f64::from(samples) * per_sample + 2.0 * MIN_SPAN;
        let mut t = from;
        while t < from + seconds {
            knee.observe(
                &busy(pods, concurrency, *done as u64, d * stretch),
                concurrency,
                t,
            );
            *done += rate * 5.0;
            t += 5.0;
        }
        t
    }

    #[test]
    fn a_pool_at_full_speed_has_no_knee() {
        let mut knee = Knee::default();
        let mut done = 0.0;
        let mut t = 0.0;
        for pods in [1, 4, 10, 30] {
            t = run(&mut knee, Pool::of(pods, 2, 1e9, 0.5), t, 3, &mut done);
        }
        assert_eq!(knee.saturation(), None);
        assert_eq!(knee.cap(30, 1000, 10.0, t), None);
    }

    #[test]
    fn the_knee_of_a_shared_downstream_is_its_capacity_in_pods_from_one_sample_past_it() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let concurrency = rng.random_range(1..=8);
            let capacity = f64::from(rng.random_range(1..=60));
            let d = rng.random_range(0.05..5.0f64);
            let knee_pods = (capacity / f64::from(concurrency)).ceil() as i32;
            let mut knee = Knee::default();
            let mut done = 0.0;
            // Below the knee first (one pod below it, or one pod), then well past it.
            let small = (knee_pods - 1).max(1);
            let t = run(
                &mut knee,
                Pool::of(small, concurrency, capacity, d),
                0.0,
                1,
                &mut done,
            );
            let big = (knee_pods * 3).max(knee_pods + 3);
            run(
                &mut knee,
                Pool::of(big, concurrency, capacity, d),
                t,
                1,
                &mut done,
            );
            let found = knee.saturation().unwrap_or_else(|| {
                panic!("no knee: capacity {capacity}, concurrency {concurrency}, {d:.2} s jobs, {big} pods")
            });
            // ceil(X / p): the pods at full speed that complete what the pool does.
            assert!(
                (found.knee - knee_pods).abs() <= 1,
                "knee {} for capacity {capacity} at concurrency {concurrency}: {knee_pods} expected",
                found.knee
            );
            assert!(
                found.marginal < 0.05,
                "flat above the knee: {} per pod",
                found.marginal
            );
        }
    }

    #[test]
    fn the_engine_probes_above_the_knee_now_and_then_and_follows_a_downstream_that_recovers() {
        let mut knee = Knee::default();
        let mut done = 0.0;
        let t = run(&mut knee, Pool::of(2, 1, 5.0, 1.0), 0.0, 1, &mut done);
        let t = run(&mut knee, Pool::of(20, 1, 5.0, 1.0), t, 1, &mut done);
        assert_eq!(knee.saturation().map(|s| s.knee), Some(5));
        // Wanted above it with work waiting: a probe one pod above (a quarter of 5).
        assert_eq!(knee.cap(20, 100, 10.0, t), Some(6));
        // The probe lasts a start-up and three spans, then the knee holds.
        assert_eq!(knee.cap(20, 100, 10.0, t + 50.0), Some(6));
        assert_eq!(knee.cap(20, 100, 10.0, t + 60.0), Some(5));
        // Nothing waiting, or not wanted: the knee, no probe.
        assert_eq!(knee.cap(20, 0, 10.0, t + 400.0), Some(5));
        assert_eq!(knee.cap(4, 100, 10.0, t + 400.0), Some(5));
        // The downstream now serves 12: the probe's 6 pods run at full speed, and
        // the knee rises to them.
        let t = run(
            &mut knee,
            Pool::of(5, 1, 12.0, 1.0),
            t + 400.0,
            1,
            &mut done,
        );
        assert_eq!(knee.cap(20, 100, 10.0, t), Some(6));
        let t = run(&mut knee, Pool::of(6, 1, 12.0, 1.0), t, 1, &mut done);
        assert_eq!(knee.saturation().map(|s| s.knee), Some(6));
        // Saturated again, at a lower capacity: measured where it is, once the
        // samples at that size have moved to it.
        run(&mut knee, Pool::of(6, 1, 3.0, 1.0), t, 6, &mut done);
        assert_eq!(knee.saturation().map(|s| s.knee), Some(3));
    }

    #[test]
    fn a_pool_that_is_not_all_busy_or_has_nothing_queued_is_not_measured() {
        let mut knee = Knee::default();
        let mut done = 0u64;
        for t in 0..100 {
            let mut obs = busy(20, 1, done, 4.0);
            obs.backlog = 0;
            knee.observe(&obs, 1, f64::from(t) * 5.0);
            obs = busy(20, 1, done, 4.0);
            obs.in_flight = 10;
            knee.observe(&obs, 1, f64::from(t) * 5.0 + 1.0);
            done += 25;
        }
        assert!(knee.rates.is_empty());
        assert_eq!(knee.saturation(), None);
    }

    #[test]
    fn a_knee_nobody_confirms_for_an_hour_is_forgotten() {
        let mut knee = Knee::default();
        let mut done = 0.0;
        let t = run(&mut knee, Pool::of(1, 1, 4.0, 1.0), 0.0, 1, &mut done);
        let t = run(&mut knee, Pool::of(12, 1, 4.0, 1.0), t, 1, &mut done);
        assert!(knee.saturation().is_some());
        knee.observe(&Observation::default(), 1, t + FORGET_AFTER + 120.0);
        assert_eq!(knee.saturation(), None);
    }

    #[test]
    fn the_message_says_the_rate_the_knee_and_the_gain_per_pod() {
        let s = Saturation {
            knee: 12,
            rate: 180.4,
            measured_at: 30,
            marginal: 0.004,
            confirmed_at: 0.0,
        };
        assert_eq!(
            s.message(),
            "completions flat at ~180 jobs/s above 12 pods (0.4 % more per pod added, measured at 30 pods)"
        );
    }
}
