//! The rate cap, on generated queues: a pool of the workers its rate limit keeps busy
//! ([`Workers::busy_at_limit`], sized on the spread of the job durations) loses no start
//! the limit allows. Each case is a queue limited to 2 to 40 jobs/s, jobs of one length,
//! exponential or lognormal (mean 50 ms to 3 s, the spread theirs), 1 to 4 jobs a pod,
//! and five minutes of arrivals at one and a half times the limit, then none. A pool
//! held at the cap is run beside one held at the spread-blind cap (`J + √J`, what the
//! engine used before it knew the spread) and one held at twice that (which never lacks
//! a slot), all from the start: the capped pool's p95 wait stays within 1 s of the
//! spread-blind pool's and within 2.5 % of the roomy one's, so its waits are the limit's.
//! (Where the durations spread widely, with over a hundred jobs in flight, both caps wait
//! 1 to 2 % longer than a pool never short of a slot: a start the bucket allows while every
//! slot is busy is late.)
//!
//! The simulation runs in virtual time: the figures are the same on every machine.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use workerpool_operator::scaling::{ScalingSpec, Workers};
use workerpool_operator::simulate::{self, DurationDist, Policy, SimConfig, Trace};

const CASES: u64 = 40;

struct Case {
    count: u32,
    concurrency: u32,
    job: DurationDist,
}

impl Case {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let count = rng.random_range(2..=40);
        let mean = 0.05 * (60.0f64).powf(rng.random::<f64>());
        let job = match rng.random_range(0..3) {
            0 => DurationDist::Const(mean),
            1 => DurationDist::Exp(mean),
            _ => {
                let sigma = rng.random_range(0.05..1.0);
                DurationDist::LogNormal {
                    median: mean / (sigma * sigma / 2.0f64).exp(),
                    sigma,
                }
            }
        };
        Case {
            count,
            concurrency: [1, 1, 2, 4][rng.random_range(0..4)],
            job,
        }
    }

    /// Five minutes at one and a half times the limit, then half an hour of nothing.
    fn trace(&self) -> Trace {
        let per_minute = u64::from(self.count) * 90;
        let mut csv = String::from("t_seconds,jobs\n");
        for minute in 0..5 {
            csv.push_str(&format!("{},{per_minute}\n", minute * 60));
        }
        csv.push_str("300,0\n2100,0\n");
        Trace::parse_csv(&csv).expect("a generated trace parses")
    }

    /// The standard deviation of the job durations.
    fn deviation(&self) -> f64 {
        match self.job {
            DurationDist::Const(_) => 0.0,
            DurationDist::Exp(mean) => mean,
            DurationDist::LogNormal { sigma, .. } => {
                self.job.mean() * ((sigma * sigma).exp() - 1.0).sqrt()
            }
        }
    }

    /// The workers the rate limit keeps busy: with the jobs' spread, or without.
    fn cap(&self, deviation: Option<f64>) -> i32 {
        Workers::new(Some(&format!("{}/s", self.count)), self.concurrency as i32)
            .busy_at_limit(self.job.mean(), deviation)
            .expect("a limit")
    }

    /// A pool held at `replicas`.
    fn held(replicas: i32) -> Policy {
        Policy::Engine(Box::new(ScalingSpec {
            min_replicas: replicas,
            max_replicas: replicas,
            ..ScalingSpec::default()
        }))
    }
}

#[test]
fn a_pool_capped_at_what_its_rate_limit_keeps_busy_waits_as_long_as_the_limit_makes_it() {
    let mut misses = Vec::new();
    for seed in 0..CASES {
        let case = Case::new(seed);
        let config = SimConfig {
            trace: case.trace(),
            policies: vec![
                Case::held(case.cap(Some(case.deviation()))),
                Case::held(2 * case.cap(None)),
                Case::held(case.cap(None)),
            ],
            pod_startup: Duration::from_secs(15),
            job_duration: case.job,
            concurrency: case.concurrency,
            seed,
            rate_limit: Some(format!("{}/s", case.count).parse().expect("a limit")),
            downstream: workerpool_operator::simulate::Downstream::default(),
        };
        let reports = simulate::run_each(&config);
        let (capped, roomy, blind) = (&reports[0], &reports[1], &reports[2]);
        assert_eq!(capped.jobs, roomy.jobs, "seed {seed}: every job runs");
        if capped.p95_wait_s > blind.p95_wait_s + 1.0
            || capped.p95_wait_s > roomy.p95_wait_s * 1.025
        {
            misses.push(format!(
                "seed {seed} ({}/s, {:?}, {} a pod): {} pods wait {:.2} s at p95, {} pods {:.2} s, \
                 {} pods {:.2} s",
                case.count,
                case.job,
                case.concurrency,
                case.cap(Some(case.deviation())),
                capped.p95_wait_s,
                2 * case.cap(None),
                roomy.p95_wait_s,
                case.cap(None),
                blind.p95_wait_s,
            ));
        }
    }
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}
