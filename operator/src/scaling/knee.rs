//! The knee: where one more pod stops raising completions.
//!
//! The engine sizes a pool on the work left and the job duration. When the jobs share
//! something that saturates (a database's connection pool, an external API's limit),
//! each job takes longer as more run, so that rule adds pods that only spread the
//! waiting, up to `maxReplicas`, and the pool hammers what is already the bottleneck.
//! This room measures instead; `engine/knee.rs` applies what it finds.
//!
//! - **What a job slot can do.** Two estimates, each taken at its lower confidence
//!   bound, the larger kept:
//!   - the mean job duration the workers measured while few jobs ran: their readings
//!     are pooled by how many jobs were in flight (powers of two), each weighted by the
//!     jobs it covers (at most [`READING_JOBS`], the workers' average's memory), and the
//!     lowest level with [`REFERENCE_JOBS`] behind it is the reference. A pooled mean,
//!     not the least reading: the least of many noisy readings is biased short, and
//!     held pools with no downstream back. Its bound is the mean plus [`Z`] standard
//!     errors (the workers' measured spread, else as wide as the mean);
//!   - completions per job slot in service measured at a smaller size, all busy: the
//!     count less [`Z`] times its square root (completions are close to Poisson).
//! - **What the pool does.** While every ready pod's slots are busy, no removed pod
//!   still drains its jobs, and work is still queued, completions over a [`MIN_SPAN`] at one size, with at least
//!   [`MIN_COMPLETIONS`], are one sample: the count against the job-slot-seconds in
//!   service.
//! - **A deficit.** A sample whose completions, at their upper bound (`c + Z√c`), are
//!   below [`SATURATED_EFFICIENCY`] of what its slots would complete at the reference
//!   speed, is a deficit. [`PERSIST`] deficits in a row, with no sample at full speed
//!   between, and the pool is saturated: `ceil(X / p)` pods at the reference speed `p`
//!   would complete the `X` a second the deficits measured. That is the knee.
//!   Without a downstream, a deficit needs a Poisson count several standard errors
//!   low, three samples running: the test on random traffic finds none.
//! - **Following it.** `X` pools the deficits' completions (fading over [`RUN_MEMORY`]),
//!   and the knee is recomputed at every sample from the best speed known at or below
//!   it (samples at the knee, busy at full speed, soon say it best); samples at or
//!   below the knee confirm it. Every [`PROBE_EVERY`] while work waits and more pods
//!   are wanted, the engine may go a quarter above it (one pod at least); a sample there
//!   at full speed, or clearly above `X` and what the knee's own size completed once
//!   measured (the marginal gain, counted as `X` was: durations miss a slot's time
//!   between jobs, completions do not), and not a deficit, raises the knee to it, and the next probe follows at once (a
//!   downstream that had room for a quarter more may have room for more: the pool
//!   climbs a quarter a step while each step pays, and a step that does not pay
//!   waits [`PROBE_EVERY`] again). A knee nothing has confirmed for
//!   [`FORGET_AFTER`] is forgotten.
//!
//! This is TCP Vegas's comparison of expected and actual throughput (Brakmo and
//! Peterson, 1994: with `BaseRTT` the least round trip seen, `Expected = cwnd / BaseRTT`,
//! and a sender whose `Actual` falls short of it is only filling queues) with the pod as
//! the window; the probe above the limit is the additive probe of Netflix's
//! concurrency-limits (its `VegasLimit` and `GradientLimit` grow the limit while latency
//! holds and cut it when it climbs).

use std::collections::BTreeMap;

use super::{Observation, Saturation};

mod levels;

use levels::Level;

/// The least time at one size, all slots busy and work queued, for a sample.
pub const MIN_SPAN: f64 = 15.0;
/// The fewest completions a sample counts.
pub const MIN_COMPLETIONS: u64 = 40;
/// Standard errors in each confidence bound.
pub const Z: f64 = 2.0;
/// Jobs one duration reading stands for at most: the workers' mean is a moving
/// average over about 20 jobs, so a reading after a hundred completions still says
/// what some twenty did.
pub const READING_JOBS: u64 = 20;
/// Jobs behind a level's pooled duration before it is a reference.
pub const REFERENCE_JOBS: f64 = 200.0;
/// Jobs behind a level's pooled duration before it can show the jobs stretched.
pub const LEVEL_JOBS: f64 = 40.0;
/// Busy slots over all ready slots at which a pool is busy enough to be measured.
pub const BUSY: f64 = 0.9;
/// Below this share of what its slots can do (at the upper bound), a sample is a deficit.
pub const SATURATED_EFFICIENCY: f64 = 0.75;
/// Deficits in a row that make a knee.
pub const PERSIST: u32 = 3;
/// Seconds over which a run of deficits' completions fade, so the knee follows a
/// downstream whose capacity moves while the pool stays saturated.
pub const RUN_MEMORY: f64 = 600.0;
/// At or above this share, a probe's pods were all of use.
pub const FULL_EFFICIENCY: f64 = 0.9;
/// How often the engine probes above a knee while work waits.
pub const PROBE_EVERY: f64 = 300.0;
/// A knee no sample has confirmed for this long is forgotten, and so are the
/// duration readings and samples older than it.
pub const FORGET_AFTER: f64 = 3600.0;

/// A span at one size being measured.
#[derive(Clone, Copy, Debug)]
struct Span {
    ready: i32,
    since: f64,
    processed: u64,
    /// Job-slot-seconds in service so far (in-flight × time, between polls).
    slot_seconds: f64,
    /// The last poll folded in: when, and the jobs in flight.
    last: (f64, u64),
}

/// Completions and job-slot-seconds pooled at one size.
#[derive(Clone, Copy, Debug, Default)]
struct Size {
    completions: f64,
    slot_seconds: f64,
    seconds: f64,
    at: f64,
    /// Samples at this size that were deficits: its speed is then not a pod's.
    deficits: u32,
}

impl Size {
    /// Completions per job slot in service: the estimate and its lower bound.
    fn per_slot(&self) -> Option<(f64, f64)> {
        (self.slot_seconds > 0.0).then(|| {
            let c = self.completions;
            (
                c / self.slot_seconds,
                (c - Z * c.sqrt()).max(0.0) / self.slot_seconds,
            )
        })
    }
}

/// A run of deficits not yet broken by a sample at full speed.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    samples: u32,
    completions: f64,
    seconds: f64,
}

/// What the engine keeps to find the knee. Pure: fed one observation a tick.
#[derive(Clone, Debug, Default)]
pub struct Knee {
    span: Option<Span>,
    /// Duration readings by level (`log2` of the jobs in flight).
    levels: BTreeMap<u32, Level>,
    /// Samples by size.
    sizes: BTreeMap<i32, Size>,
    /// The last poll: its completed count, jobs in flight and backlog.
    last: Option<(u64, u64, u64)>,
    /// The last polls' times and completed counts, newest last.
    recent: std::collections::VecDeque<(f64, u64)>,
    run: Run,
    found: Option<Saturation>,
    /// When the last probe above the knee began.
    probed_at: Option<f64>,
    /// Samples taken.
    samples: u64,
    /// Jobs one pod runs, as last told.
    concurrency: i32,
    /// The ready count, and since when it has been that.
    steady: Option<(i32, f64)>,
}

impl Knee {
    /// Folds one tick's observation in; `concurrency` is the jobs one pod runs.
    pub fn observe(&mut self, obs: &Observation, concurrency: i32, now: f64) {
        self.concurrency = concurrency.max(1);
        if self
            .found
            .is_some_and(|f| now - f.confirmed_at > FORGET_AFTER)
        {
            self.found = None;
            self.probed_at = None;
        }
        self.read_duration(obs, now);
        self.stretched(concurrency.max(1), now);
        self.measure(obs, concurrency, now);
    }

    /// Takes a sample when the pool has been busy at one size long enough.
    fn measure(&mut self, obs: &Observation, concurrency: i32, now: f64) {
        let slots = f64::from(obs.ready_replicas.max(0)) * f64::from(concurrency.max(1));
        if self
            .steady
            .is_none_or(|(ready, _)| ready != obs.ready_replicas)
        {
            self.steady = Some((obs.ready_replicas, now));
        }
        // Slots that filled at once complete their first jobs only a job's time later:
        // a span starts a job duration after the ready count last changed, and lasts
        // two at least.
        let job = obs
            .job_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(0.0);
        let settled = self.steady.is_some_and(|(_, since)| now - since >= job);
        let busy = settled
            && obs.ready_replicas > 0
            && obs.ready_replicas == obs.current_replicas
            && obs.backlog > 0
            && obs.in_flight as f64 >= BUSY * slots
            // Jobs beyond the slots are a removed pod's, draining: what the pool
            // completes then is not what its size does.
            && obs.in_flight as f64 <= slots;
        let fresh = Span {
            ready: obs.ready_replicas,
            since: now,
            processed: obs.processed_total,
            slot_seconds: 0.0,
            last: (now, obs.in_flight),
        };
        let mut span = match self.span {
            Some(s)
                if busy && s.ready == obs.ready_replicas && obs.processed_total >= s.processed =>
            {
                s
            }
            _ => {
                self.span = busy.then_some(fresh);
                return;
            }
        };
        let (at, in_flight) = span.last;
        span.slot_seconds += (now - at) * (in_flight + obs.in_flight) as f64 / 2.0;
        span.last = (now, obs.in_flight);
        self.span = Some(span);
        let done = obs.processed_total - span.processed;
        let elapsed = now - span.since;
        if elapsed < MIN_SPAN.max(2.0 * job) || done < MIN_COMPLETIONS {
            return;
        }
        self.span = Some(fresh);
        self.sample(
            obs.ready_replicas,
            concurrency.max(1),
            done as f64,
            elapsed,
            span.slot_seconds,
            now,
        );
    }

    /// A slot's speed from the durations at the lowest level of jobs in flight that
    /// has enough of them: `(mean, lower bound)` in jobs a second.
    fn by_duration(&self) -> Option<(f64, f64)> {
        self.levels
            .values()
            .find_map(Level::duration)
            .map(|(mean, upper)| (1.0 / mean, 1.0 / upper))
    }

    /// A slot's speed from the best size within `pods` that completed enough and
    /// showed no deficit: `(mean, lower bound)` in jobs a second.
    fn by_completions(&self, pods: impl std::ops::RangeBounds<i32>) -> Option<(f64, f64)> {
        self.sizes
            .range(pods)
            .filter(|(_, s)| s.deficits == 0 && s.completions >= MIN_COMPLETIONS as f64)
            .filter_map(|(_, s)| s.per_slot())
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// What a job slot completes a second at full speed, from sizes below `pods` that
    /// showed no deficit (or at the lowest level of jobs in flight): the larger lower
    /// bound of the two estimates, with the estimate that gave it.
    fn reference(&self, pods: i32) -> Option<(f64, f64)> {
        [self.by_duration(), self.by_completions(..pods)]
            .into_iter()
            .flatten()
            .filter(|(_, lower)| *lower > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// What a job slot completes a second at full speed, to size the knee on: the two
    /// estimates of [`Knee::reference`] (the durations, the best size), each weighted
    /// by its precision when they agree within their errors, so that one unlucky
    /// estimate does not size the knee alone; when they do not, one was read
    /// saturated, and the larger lower bound is kept.
    fn speed(&self) -> Option<f64> {
        let (by_duration, by_completions) = (self.by_duration(), self.by_completions(..));
        let error = |(mean, lower): (f64, f64)| ((mean - lower) / Z).max(mean * 1e-3);
        match (by_duration, by_completions) {
            (Some(a), Some(b)) if a.0 > 0.0 && b.0 > 0.0 => {
                let (ea, eb) = (error(a), error(b));
                if (a.0 - b.0).abs() <= Z * ea.hypot(eb) {
                    let (wa, wb) = (1.0 / (ea * ea), 1.0 / (eb * eb));
                    Some((a.0 * wa + b.0 * wb) / (wa + wb))
                } else {
                    // They disagree: one was read saturated. The larger lower bound.
                    Some(if a.1 >= b.1 { a.0 } else { b.0 })
                }
            }
            (a, b) => a.or(b).map(|(mean, _)| mean).filter(|m| *m > 0.0),
        }
    }

    /// One sample: `done` jobs completed in `seconds` at `pods`, with `slot_seconds`
    /// of jobs in service.
    fn sample(
        &mut self,
        pods: i32,
        concurrency: i32,
        done: f64,
        seconds: f64,
        slot_seconds: f64,
        now: f64,
    ) {
        let reference = self.reference(pods);
        self.sizes.retain(|_, s| now - s.at <= FORGET_AFTER);
        let size = self.sizes.entry(pods).or_default();
        size.completions += done;
        size.slot_seconds += slot_seconds;
        size.seconds += seconds;
        size.at = now;
        self.samples += 1;
        let Some((speed, lower)) = reference else {
            return;
        };
        let expected = slot_seconds * lower;
        let deficit = done + Z * done.sqrt() < SATURATED_EFFICIENCY * expected;
        let rate = done / seconds;
        let full = !deficit && done >= FULL_EFFICIENCY * slot_seconds * speed;
        if let Some(size) = self.sizes.get_mut(&pods) {
            size.deficits += u32::from(deficit);
        }
        if deficit {
            // The deficits' completions, pooled: older ones fade over RUN_MEMORY.
            let fade = (-seconds / RUN_MEMORY).exp();
            self.run.samples += 1;
            self.run.completions = self.run.completions * fade + done;
            self.run.seconds = self.run.seconds * fade + seconds;
            let run = self.run;
            match self.found.as_mut() {
                Some(found) => {
                    found.rate = run.completions / run.seconds;
                    found.measured_at = pods;
                    found.confirmed_at = now;
                    found.climbing = false;
                }
                None if run.samples >= PERSIST => {
                    self.found = Some(Saturation {
                        knee: pods,
                        rate: run.completions / run.seconds,
                        measured_at: pods,
                        marginal: 0.0,
                        confirmed_at: now,
                        climbing: false,
                    });
                }
                None => {}
            }
        } else if full {
            self.run = Run::default();
        }
        let Some(mut found) = self.found else {
            return;
        };
        // Or, counted as the knee's rate was: past a knee completions stay flat, so a
        // probe that completed clearly more (its count's lower bound above the rate)
        // found room. This needs no speed a slot, which its durations overstate when
        // a slot loses time between jobs (taking and settling them), enough to keep
        // a probe from reading full speed though all its pods were of use.
        // `X` is what the deficits completed; what the knee's own size completed, when
        // measured, is the firmer floor (a knee found on the way up may have been sized
        // on a rate the pool, not yet all busy, fell short of).
        let floor = self
            .sizes
            .get(&found.knee)
            .filter(|s| s.completions >= MIN_COMPLETIONS as f64 && s.seconds > 0.0)
            .map_or(found.rate, |s| found.rate.max(s.completions / s.seconds));
        let gained = pods > found.knee && (done - Z * done.sqrt()) / seconds > floor;
        if !deficit && pods > found.knee && (full || gained) {
            // A probe's pods were all of use: the downstream has room again, and
            // may have more; the next probe is due at once rather than in
            // PROBE_EVERY, so a pool climbs a quarter at a time while each step pays.
            found.knee = pods;
            self.probed_at = None;
            found.rate = rate;
            found.measured_at = pods;
            found.confirmed_at = now;
            found.climbing = true;
        } else if pods > found.knee {
            // A probe that did not pay: the climb, if any, ends here.
            found.climbing = false;
        } else if !deficit && pods <= found.knee {
            found.confirmed_at = now;
        }
        // The knee in pods at the speed known best: samples at the knee, busy at full
        // speed, soon say it.
        let speed = self.speed().unwrap_or(speed);
        let per_pod = speed * f64::from(concurrency);
        // Within 5 % of a whole pod counts as that pod: the rates are measured.
        found.knee = ((found.rate / per_pod - 0.05).ceil() as i32).max(1);
        found.marginal = marginal(&self.sizes, found.knee, per_pod);
        self.found = Some(found);
    }

    /// The knee measured, if the pool is saturated.
    pub fn saturation(&self) -> Option<Saturation> {
        self.found
    }

    /// The most pods the engine should ask for now: the knee, or a quarter above it
    /// (one pod at least) while a probe runs; `None` without a knee. A probe starts
    /// when `wanted` (what the engine would ask for without the knee) is above it,
    /// work waits, and the last one is [`PROBE_EVERY`] old.
    ///
    /// A knee not yet bounded from below (no size under it seen to complete less: the
    /// speed it was sized on may have been a saturated one, as when a pool meets its
    /// first load already past the knee, and no light load measured a job's own
    /// duration) is probed downward first: three quarters of the knee (one pod less at
    /// least), while work waits, until a sample is taken there. Past the
    /// knee, completions stay flat, so the smaller size does as much and the knee
    /// follows it down; below it, that size measures a pod's own speed.
    pub fn cap(&mut self, wanted: i32, backlog: u64, startup: f64, now: f64) -> Option<i32> {
        let found = self.found?;
        let step = (found.knee / 4).max(1);
        if backlog > 0
            && let Some(down) = self.probe_down(&found)
        {
            return Some(down);
        }
        if wanted <= found.knee || backlog == 0 {
            return Some(found.knee);
        }
        let probe = found.knee + step;
        let sampled = |at: f64| self.sizes.get(&probe).is_some_and(|s| s.at > at);
        let probing = match self.probed_at {
            // Until a sample is taken there, or long enough for the pods to start and
            // a sample to be taken.
            Some(at) if now - at < startup + 3.0 * MIN_SPAN && !sampled(at) => true,
            Some(at) if now - at < PROBE_EVERY => false,
            _ => {
                self.probed_at = Some(now);
                true
            }
        };
        Some(if probing { probe } else { found.knee })
    }
}

impl Knee {
    /// The size to probe below the knee at, while no size under it was seen to
    /// complete less (so the knee is not yet bounded from below) and that size was not
    /// measured yet.
    fn probe_down(&self, found: &Saturation) -> Option<i32> {
        let knee = found.knee;
        // A reference duration read with well under the knee's slots in flight was a
        // pod's own speed: sized on one read past the knee, the knee comes out at
        // about the jobs that were in flight then.
        let slots = f64::from(knee) * f64::from(self.concurrency.max(1));
        let light = self
            .levels
            .values()
            .find(|l| l.duration().is_some())
            .is_some_and(|l| l.all.in_flight / l.all.jobs <= SATURATED_EFFICIENCY * slots);
        // A size below the knee that completed clearly less than the knee's rate: the
        // pods above it were of use.
        let fewer = |s: &Size| {
            let c = s.completions;
            c >= MIN_COMPLETIONS as f64
                && (c + Z * c.sqrt()) / s.seconds < FULL_EFFICIENCY * found.rate
        };
        let bounded = light || self.sizes.range(..knee).any(|(_, s)| fewer(s));
        // A quarter down: past the knee a step down costs nothing (completions stay
        // flat); the one step that lands below it costs at most a quarter of them
        // until the pods it removed are back.
        let down = (knee * 3 / 4).min(knee - 1);
        (!bounded && down >= 1 && !self.sizes.contains_key(&down)).then_some(down)
    }
}

/// What each pod above `knee` added, as a share of the knee's rate: between the
/// smallest and the largest size measured above it when there are two, else between
/// what `knee` pods at full speed (`per_pod` each) would complete and the size above.
fn marginal(sizes: &BTreeMap<i32, Size>, knee: i32, per_pod: f64) -> f64 {
    let rate = |s: &Size| s.completions / s.seconds.max(f64::MIN_POSITIVE);
    let mut above = sizes.range(knee + 1..);
    let first = above.next();
    let last = above.next_back();
    let (from, to) = match (first, last) {
        (Some((&a, sa)), Some((&b, sb))) => ((a, rate(sa)), (b, rate(sb))),
        (Some((&b, sb)), None) => {
            let rb = rate(sb);
            ((knee, (f64::from(knee) * per_pod).min(rb)), (b, rb))
        }
        _ => return 0.0,
    };
    let base = from.1.max(f64::MIN_POSITIVE);
    ((to.1 - from.1) / f64::from(to.0 - from.0).max(1.0) / base).max(0.0)
}

#[cfg(test)]
mod tests;
