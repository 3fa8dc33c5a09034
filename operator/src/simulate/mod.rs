//! A discrete-event simulation of a worker pool in virtual time, to compare the scaling
//! engine with how KEDA scales a Redis list today.
//!
//! Jobs arrive from a [`Trace`]; pods become ready after a start-up delay, take jobs FIFO
//! up to `concurrency` at a time, and on scale-down stop taking jobs and finish the ones
//! they hold before they go. Both policies see the same arrivals and the same job
//! durations. A queue with a rate limit starts jobs no faster than the workers' Redis
//! bucket lets them (the same GCRA, on the virtual clock). A [`Downstream`] the jobs
//! share (a database pool, an external service) slows them once it is saturated, which
//! neither policy is told of: the workers only see their jobs take longer. [`run`] is
//! pure and deterministic for a seed.

pub mod cli;
pub mod compare;
mod dist;
pub mod erlang;
pub mod fuzz;
mod keda;
mod trace;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;

pub use dist::DurationDist;
pub use keda::{KedaModel, KedaSettings};
pub use trace::{Shape, Trace};

use workerpool_queue::rate::RateLimit;

use crate::scaling::{Engine, Observation, ScalingSpec, Workers};

/// What can go wrong setting a simulation up.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A trace line could not be read.
    #[error("trace line {line}: {reason}")]
    Trace {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A command-line value could not be read.
    #[error("{0}")]
    Argument(String),
}

/// A scaling policy to simulate.
#[derive(Clone, Debug, PartialEq)]
pub enum Policy {
    /// The workerpool scaling engine with this spec.
    Engine(Box<ScalingSpec>),
    /// KEDA's Redis list scaler with these settings.
    Keda(KedaSettings),
}

impl Policy {
    /// The key of this policy in a [`Report`].
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Engine(_) => "engine",
            Policy::Keda(_) => "keda",
        }
    }
}

/// One simulation: the traffic, the workers, and the policies to compare.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The arrivals.
    pub trace: Trace,
    /// The policies, each simulated on the same arrivals and job durations.
    pub policies: Vec<Policy>,
    /// Time from a pod's creation to its readiness.
    pub pod_startup: Duration,
    /// How long jobs take.
    pub job_duration: DurationDist,
    /// Jobs one pod runs at once.
    pub concurrency: u32,
    /// Seed for arrival times within trace rows and for job durations.
    pub seed: u64,
    /// The queue's rate limit (`spec.worker.rateLimit`), which the engine knows too.
    pub rate_limit: Option<RateLimit>,
    /// What the jobs call, which no policy knows of.
    pub downstream: Downstream,
}

/// A resource every running job uses, which the pool is not told of: a database's
/// connection pool, an external API. Unset fields put no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Downstream {
    /// Jobs it serves at full speed at once. With `n` above it in service across the
    /// pool, each progresses at `capacity / n` of its speed (processor sharing): a job
    /// of `d` seconds alone takes `d * n / capacity`, and the pool's completions stay
    /// at `capacity / d` a second however many run.
    pub capacity: Option<u32>,
    /// Jobs it admits a second: each job waits in its slot for its turn (first come,
    /// first served), then runs its duration.
    pub rate: Option<f64>,
}

impl Downstream {
    /// Whether it limits anything.
    pub fn is_set(&self) -> bool {
        self.capacity.is_some() || self.rate.is_some()
    }
}

/// The outcome of one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyReport {
    /// Median time from arrival to start, in seconds.
    pub p50_wait_s: f64,
    /// 95th percentile wait, in seconds.
    pub p95_wait_s: f64,
    /// 99th percentile wait, in seconds.
    pub p99_wait_s: f64,
    /// Most jobs waiting at once.
    pub max_backlog: u64,
    /// Pod-seconds paid for, from creation to termination (start-up and draining included).
    pub replica_seconds: f64,
    /// Times the replica count was changed.
    pub scale_events: u64,
    /// The share of the job slots paid for that ran a job: job-seconds over
    /// replica-seconds × concurrency (start-up and draining count as paid).
    pub utilization: f64,
    /// Jobs completed.
    pub jobs: u64,
    /// The engine's scale changes, in order (empty for KEDA, whose model gives no reasons).
    #[serde(skip)]
    pub steps: Vec<Step>,
    /// Polls at which the engine found the pool saturated (a knee measured).
    #[serde(skip)]
    pub saturated_polls: u64,
    /// The knee the engine last reported, if it ever found one.
    #[serde(skip)]
    pub knee: Option<i32>,
    /// The most replicas the policy asked for at once.
    #[serde(skip)]
    pub peak_replicas: i32,
}

#[cfg(test)]
impl PolicyReport {
    /// A report with these waits and replica-seconds and nothing else, for the tests
    /// that judge reports against each other.
    pub(crate) fn waits(p95_wait_s: f64, p99_wait_s: f64, replica_seconds: f64) -> Self {
        PolicyReport {
            p50_wait_s: 0.0,
            p95_wait_s,
            p99_wait_s,
            max_backlog: 0,
            replica_seconds,
            scale_events: 0,
            utilization: 0.0,
            jobs: 0,
            steps: Vec::new(),
            saturated_polls: 0,
            knee: None,
            peak_replicas: 0,
        }
    }
}

/// One change of the engine's replica count, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    /// Seconds into the trace.
    pub at_s: f64,
    /// Replicas before.
    pub from: i32,
    /// Replicas after.
    pub to: i32,
    /// Jobs waiting at the poll.
    pub backlog: u64,
    /// Jobs running at the poll.
    pub in_flight: u64,
    /// The engine's reason (shown as status, events and logs give it); formatted only
    /// when printed, so the runs that do not print it pay nothing for it.
    pub reason: crate::scaling::Reason,
}

/// The outcome of every policy, keyed by policy name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Report {
    /// `engine`, `keda`.
    pub policies: BTreeMap<String, PolicyReport>,
}

/// Simulates every policy of `config`, keyed by policy name (a later policy of the same
/// name replaces an earlier one: use [`run_each`] to simulate several of a kind).
pub fn run(config: &SimConfig) -> Report {
    let policies = config
        .policies
        .iter()
        .map(|policy| policy.name().to_string())
        .zip(run_each(config))
        .collect();
    Report { policies }
}

/// Simulates every policy of `config`, in its order. The policies run on separate
/// threads; each run is deterministic, so the result does not depend on how they interleave.
pub fn run_each(config: &SimConfig) -> Vec<PolicyReport> {
    let arrivals = config.trace.arrival_times(config.seed);
    std::thread::scope(|scope| {
        let runs: Vec<_> = config
            .policies
            .iter()
            .map(|policy| scope.spawn(|| simulate(config, policy, &arrivals)))
            .collect();
        runs.into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// A controller driving the simulated Deployment.
enum Controller {
    Engine {
        engine: Box<Engine>,
        spec: ScalingSpec,
    },
    Keda(KedaModel),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Event {
    PodReady(usize),
    /// A pod finished a job that took this many seconds.
    JobDone(usize, f64),
    /// A job the downstream admits now: its pod, its duration alone, when it started.
    Admit(usize, f64, f64),
    /// The shared downstream's next job may be done (stale unless the generation is
    /// the current one).
    Shared(u64),
    /// The rate limit allows the next start.
    RateAllows,
    /// A controller's periodic tick; the number tells which loop (KEDA has two).
    Tick(u8),
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Scheduled {
    at: f64,
    seq: u64,
    event: Event,
}

impl Eq for Scheduled {}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: the heap pops the earliest.
        other.at.total_cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodState {
    Starting,
    Ready,
    Draining,
    Gone,
}

struct Pod {
    state: PodState,
    busy: u32,
}

/// The simulated cluster: queue, pods, clock and tallies.
struct World<'a> {
    config: &'a SimConfig,
    now: f64,
    seq: u64,
    events: BinaryHeap<Scheduled>,
    queue: VecDeque<(f64, f64)>,
    pods: Vec<Pod>,
    /// Free job slots as pod indices; entries of pods no longer ready are skipped.
    free_slots: Vec<usize>,
    desired: i32,
    /// The most replicas asked for at once.
    peak: i32,
    alive: u64,
    in_flight: u64,
    processed: u64,
    waits: Vec<f32>,
    max_backlog: u64,
    replica_seconds: f64,
    scale_events: u64,
    /// The rate limit's theoretical arrival time of the next start (GCRA).
    rate_tat: f64,
    /// A [`Event::RateAllows`] is scheduled.
    rate_wake: bool,
    /// Jobs finished since the last reading, their seconds, and the sum of
    /// their squares.
    timed: (u64, f64, f64),
    /// Seconds of jobs run.
    busy: f64,
    /// The queue's mean job duration as the workers keep it in Redis.
    job_seconds: Option<f64>,
    /// The mean of the squared job durations, kept beside it.
    job_seconds_sq: Option<f64>,
    /// The downstream's next free admission time (its rate).
    admit_at: f64,
    /// The jobs sharing the downstream's capacity.
    shared: Shared,
}

/// Jobs sharing a downstream of limited capacity (processor sharing), in virtual
/// work: every job in service progresses at the same speed, `min(1, capacity / n)`, so
/// the order they finish in is the order of their finishing work, fixed at entry.
#[derive(Default)]
struct Shared {
    /// Work each job in service has done so far, in seconds of its duration alone.
    work: f64,
    /// When `work` was last brought up to date.
    at: f64,
    /// Jobs in service: the work at which each is done, its pod, its start.
    jobs: BinaryHeap<std::cmp::Reverse<(OrdF64, usize, OrdF64)>>,
    /// The generation of the one [`Event::Shared`] that counts.
    generation: u64,
}

/// An `f64` ordered by `total_cmp`, for the shared downstream's heap.
#[derive(Clone, Copy, Debug, PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl World<'_> {
    /// Whether the rate limit lets a job start now; if not, wakes the dispatch when it
    /// will. Spends the start when it does.
    fn rate_allows(&mut self) -> bool {
        let Some(limit) = self.config.rate_limit else {
            return true;
        };
        let interval = limit.interval_ms() / 1000.0;
        let tolerance = limit.tolerance_ms() / 1000.0;
        let tat = self.rate_tat.max(self.now);
        let allowed_at = tat - tolerance;
        if self.now + 1e-9 < allowed_at {
            if !self.rate_wake {
                self.rate_wake = true;
                self.schedule(allowed_at, Event::RateAllows);
            }
            return false;
        }
        self.rate_tat = tat + interval;
        true
    }

    fn schedule(&mut self, at: f64, event: Event) {
        self.seq += 1;
        self.events.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    fn advance(&mut self, to: f64) {
        if to > self.now {
            self.replica_seconds += self.alive as f64 * (to - self.now);
            self.now = to;
        }
    }

    fn ready(&self) -> i32 {
        let ready = self
            .pods
            .iter()
            .filter(|p| p.state == PodState::Ready)
            .count();
        i32::try_from(ready).unwrap_or(i32::MAX)
    }

    fn observation(&self) -> Observation {
        Observation {
            backlog: self.queue.len() as u64,
            in_flight: self.in_flight,
            due: 0,
            oldest_job_age_seconds: self.queue.front().map(|&(arrived, _)| self.now - arrived),
            processed_total: self.processed,
            current_replicas: self.desired,
            ready_replicas: self.ready(),
            job_seconds: self.job_seconds,
            job_seconds_deviation: self
                .job_seconds
                .zip(self.job_seconds_sq)
                .map(|(mean, sq)| (sq - mean * mean).max(0.0).sqrt()),
        }
    }

    fn dispatch(&mut self) {
        while !self.queue.is_empty() {
            let Some(pod) = self.free_slots.pop() else {
                break;
            };
            if self.pods[pod].state != PodState::Ready {
                continue;
            }
            if !self.rate_allows() {
                self.free_slots.push(pod);
                break;
            }
            let Some((arrived, duration)) = self.queue.pop_front() else {
                break;
            };
            self.pods[pod].busy += 1;
            self.in_flight += 1;
            self.waits.push((self.now - arrived) as f32);
            self.start_service(pod, duration);
        }
    }

    /// A job starts on `pod`: without a downstream it is done `duration` from now;
    /// with one, when the downstream admits it and has served it.
    fn start_service(&mut self, pod: usize, duration: f64) {
        let downstream = self.config.downstream;
        if !downstream.is_set() {
            self.schedule(self.now + duration, Event::JobDone(pod, duration));
            return;
        }
        match downstream.rate.filter(|r| *r > 0.0) {
            Some(rate) => {
                let turn = self.admit_at.max(self.now);
                self.admit_at = turn + 1.0 / rate;
                self.schedule(turn, Event::Admit(pod, duration, self.now));
            }
            None => self.admit(pod, duration, self.now),
        }
    }

    /// The downstream serves a job of `pod` that started at `started`.
    fn admit(&mut self, pod: usize, duration: f64, started: f64) {
        match self.config.downstream.capacity {
            None => {
                let at = self.now + duration;
                self.schedule(at, Event::JobDone(pod, at - started));
            }
            Some(_) => {
                self.share_until_now();
                let done_at = self.shared.work + duration;
                self.shared
                    .jobs
                    .push(std::cmp::Reverse((OrdF64(done_at), pod, OrdF64(started))));
                self.share_next();
            }
        }
    }

    /// How fast each job in the shared downstream progresses now.
    fn share_speed(&self) -> f64 {
        let n = self.shared.jobs.len() as f64;
        match self.config.downstream.capacity {
            Some(capacity) if n > f64::from(capacity) => f64::from(capacity.max(1)) / n,
            _ => 1.0,
        }
    }

    /// Brings the work done in the shared downstream up to now.
    fn share_until_now(&mut self) {
        let speed = self.share_speed();
        self.shared.work += (self.now - self.shared.at) * speed;
        self.shared.at = self.now;
    }

    /// Schedules the shared downstream's next completion at the speed of now.
    fn share_next(&mut self) {
        self.shared.generation += 1;
        if let Some(std::cmp::Reverse((OrdF64(done_at), _, _))) = self.shared.jobs.peek() {
            let at = self.now + (done_at - self.shared.work).max(0.0) / self.share_speed();
            let generation = self.shared.generation;
            self.schedule(at, Event::Shared(generation));
        }
    }

    /// The shared downstream's jobs whose work is done finish.
    fn shared_done(&mut self, generation: u64) {
        if generation != self.shared.generation {
            return;
        }
        self.share_until_now();
        while let Some(&std::cmp::Reverse((OrdF64(done_at), pod, OrdF64(started)))) =
            self.shared.jobs.peek()
        {
            if done_at > self.shared.work + 1e-9 {
                break;
            }
            self.shared.jobs.pop();
            let seconds = self.now - started;
            self.job_done(pod, seconds);
        }
        self.share_next();
    }

    /// Folds the jobs finished since the last reading into the mean job
    /// duration and the mean of its squares, as the workers' heartbeats do
    /// (`heartbeat.lua`).
    fn fold_job_durations(&mut self) {
        let (jobs, seconds, squares) = std::mem::take(&mut self.timed);
        if jobs == 0 {
            return;
        }
        let fold = |old, sum: f64| {
            Some(workerpool_queue::ops::fold_duration(
                old,
                sum / jobs as f64,
                jobs,
            ))
        };
        self.job_seconds = fold(self.job_seconds, seconds);
        self.job_seconds_sq = fold(self.job_seconds_sq, squares);
    }

    fn pod_ready(&mut self, pod: usize) {
        if self.pods[pod].state == PodState::Starting {
            self.pods[pod].state = PodState::Ready;
            self.free_slots
                .extend(std::iter::repeat_n(pod, self.config.concurrency as usize));
        }
    }

    fn job_done(&mut self, pod: usize, seconds: f64) {
        self.timed.0 += 1;
        self.timed.1 += seconds;
        self.timed.2 += seconds * seconds;
        self.busy += seconds;
        self.in_flight -= 1;
        self.processed += 1;
        let p = &mut self.pods[pod];
        p.busy -= 1;
        match p.state {
            PodState::Ready => self.free_slots.push(pod),
            PodState::Draining if p.busy == 0 => {
                p.state = PodState::Gone;
                self.alive -= 1;
            }
            _ => {}
        }
    }

    /// Sets the Deployment's replicas. Removal order follows the ReplicaSet's preference
    /// for pods that are not ready, then idle pods (the operator marks them cheapest to
    /// delete), then the least busy; a removed busy pod finishes its jobs first.
    fn scale_to(&mut self, desired: i32) {
        let desired = desired.max(0);
        if desired == self.desired {
            return;
        }
        self.scale_events += 1;
        let startup = self.config.pod_startup.as_secs_f64();
        if desired > self.desired {
            for _ in self.desired..desired {
                self.pods.push(Pod {
                    state: PodState::Starting,
                    busy: 0,
                });
                self.alive += 1;
                let index = self.pods.len() - 1;
                self.schedule(self.now + startup, Event::PodReady(index));
            }
        } else {
            let mut candidates: Vec<usize> = (0..self.pods.len())
                .filter(|&i| matches!(self.pods[i].state, PodState::Starting | PodState::Ready))
                .collect();
            candidates.sort_by_key(|&i| {
                let pod = &self.pods[i];
                (pod.state == PodState::Ready, pod.busy, std::cmp::Reverse(i))
            });
            let remove = usize::try_from(self.desired - desired).unwrap_or(0);
            for &i in candidates.iter().take(remove) {
                let pod = &mut self.pods[i];
                if pod.busy == 0 {
                    pod.state = PodState::Gone;
                    self.alive -= 1;
                } else {
                    pod.state = PodState::Draining;
                }
            }
        }
        self.desired = desired;
        self.peak = self.peak.max(desired);
    }
}

fn simulate(config: &SimConfig, policy: &Policy, arrivals: &[f64]) -> PolicyReport {
    let mut durations = StdRng::seed_from_u64(config.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut world = World {
        config,
        now: 0.0,
        seq: 0,
        events: BinaryHeap::new(),
        queue: VecDeque::new(),
        pods: Vec::new(),
        free_slots: Vec::new(),
        desired: 0,
        peak: 0,
        alive: 0,
        in_flight: 0,
        processed: 0,
        waits: Vec::with_capacity(arrivals.len()),
        max_backlog: 0,
        replica_seconds: 0.0,
        scale_events: 0,
        rate_tat: 0.0,
        rate_wake: false,
        timed: (0, 0.0, 0.0),
        busy: 0.0,
        job_seconds: None,
        job_seconds_sq: None,
        admit_at: 0.0,
        shared: Shared::default(),
    };
    let (mut controller, periods) = match policy {
        Policy::Engine(spec) => {
            let period = f64::from(spec.poll_interval_seconds.max(1));
            let mut engine = Box::<Engine>::default();
            engine.set_workers(Workers {
                rate_limit: config.rate_limit,
                concurrency: i32::try_from(config.concurrency).unwrap_or(i32::MAX),
            });
            (
                Controller::Engine {
                    engine,
                    spec: (**spec).clone(),
                },
                vec![period],
            )
        }
        Policy::Keda(settings) => {
            let model = KedaModel::new(settings);
            let periods = vec![model.polling_interval(), model.hpa_sync_period()];
            (Controller::Keda(model), periods)
        }
    };
    // Every loop but the first keeps its own clock, half a period out of phase with
    // the first (the mean of a phase that is uniform over the period): KEDA's HPA
    // syncs on the HPA controller's clock, not right after KEDA's poll.
    for (kind, period) in periods.iter().enumerate() {
        let phase = if kind == 0 { 0.0 } else { period / 2.0 };
        world.schedule(phase, Event::Tick(u8::try_from(kind).unwrap_or(0)));
    }
    let end = config.trace.end();
    let mut steps = Vec::new();
    let (mut saturated_polls, mut knee) = (0, None);
    let mut next_arrival = 0;
    loop {
        let arrival = arrivals.get(next_arrival).copied();
        let event = world.events.peek().copied();
        let done = arrival.is_none() && world.queue.is_empty() && world.in_flight == 0;
        match (arrival, event) {
            (Some(a), e) if e.is_none_or(|e| a < e.at) => {
                world.advance(a);
                next_arrival += 1;
                world
                    .queue
                    .push_back((a, config.job_duration.sample(&mut durations)));
                world.dispatch();
                world.max_backlog = world.max_backlog.max(world.queue.len() as u64);
            }
            (_, Some(e)) => {
                if done && e.at >= end {
                    world.advance(end);
                    break;
                }
                world.events.pop();
                world.advance(e.at);
                match e.event {
                    Event::PodReady(pod) => world.pod_ready(pod),
                    Event::JobDone(pod, seconds) => world.job_done(pod, seconds),
                    Event::Admit(pod, duration, started) => world.admit(pod, duration, started),
                    Event::Shared(generation) => world.shared_done(generation),
                    Event::RateAllows => world.rate_wake = false,
                    Event::Tick(kind) => {
                        world.fold_job_durations();
                        let observation = world.observation();
                        let now = Duration::from_secs_f64(world.now);
                        // The engine's reason goes with the change it asked for, recorded
                        // where the change is applied.
                        let (desired, reason) = match &mut controller {
                            Controller::Engine { engine, spec } => {
                                let decision = engine.tick(spec, &observation, now);
                                if let Some(saturation) = decision.saturation {
                                    saturated_polls += 1;
                                    knee = Some(saturation.knee);
                                }
                                (Some(decision.desired), Some(decision.reason))
                            }
                            Controller::Keda(model) => {
                                (model.tick(kind, world.now, &observation), None)
                            }
                        };
                        if let Some(desired) = desired {
                            let from = world.desired;
                            world.scale_to(desired);
                            if let Controller::Engine { engine, .. } = &mut controller
                                && world.desired != from
                            {
                                engine.applied(now, from, world.desired);
                                if let Some(reason) = reason {
                                    steps.push(Step {
                                        at_s: world.now,
                                        from,
                                        to: world.desired,
                                        backlog: observation.backlog,
                                        in_flight: observation.in_flight,
                                        reason,
                                    });
                                }
                            }
                        }
                        let period = periods.get(usize::from(kind)).copied().unwrap_or(15.0);
                        world.schedule(world.now + period, Event::Tick(kind));
                    }
                }
                world.dispatch();
            }
            (_, None) => break,
        }
    }
    world.advance(end);
    let mut waits = std::mem::take(&mut world.waits);
    waits.sort_by(f32::total_cmp);
    PolicyReport {
        p50_wait_s: percentile(&waits, 0.50),
        p95_wait_s: percentile(&waits, 0.95),
        p99_wait_s: percentile(&waits, 0.99),
        max_backlog: world.max_backlog,
        replica_seconds: world.replica_seconds.round(),
        scale_events: world.scale_events,
        steps,
        saturated_polls,
        knee,
        peak_replicas: world.peak,
        jobs: world.processed,
        utilization: if world.replica_seconds > 0.0 {
            (1000.0 * world.busy / (world.replica_seconds * f64::from(config.concurrency.max(1))))
                .round()
                / 1000.0
        } else {
            0.0
        },
    }
}

/// Nearest-rank percentile of sorted values, rounded to milliseconds.
fn percentile(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    (f64::from(sorted[rank - 1]) * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests;
