//! Traffic nobody wrote down: random traces and workers from a seed, to hold the engine
//! against KEDA on shapes outside `operator/traces`.
//!
//! Each seed gives one [`Case`]: a shape (a lone spike on a warm or a cold pool, on/off
//! bursts, a ramp, a noisy day, steady traffic), its sizes and gaps, the job durations
//! (constant, exponential or log-normal), the jobs a pod runs at once, the pods' start-up
//! time, and sometimes a rate limit. The same seed always gives the same case, so a case
//! that fails can be replayed with `simulate --fuzz 1 --seed S`.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use workerpool_queue::rate::RateLimit;

use super::compare::Comparison;
use super::{DurationDist, SimConfig, Trace};
use crate::scaling::ScalingSpec;

/// The shapes the generator draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FuzzShape {
    /// Steady traffic with one short spike in the middle.
    WarmSpike,
    /// A quiet queue (a trickle or nothing) with one short spike.
    ColdSpike,
    /// Bursts at a high rate separated by silences.
    OnOff,
    /// A rate that climbs (or falls) linearly.
    Ramp,
    /// A compressed day: a sine between a low and a high rate, with noise.
    Day,
    /// Steady traffic at a random rate.
    Steady,
}

impl FuzzShape {
    const ALL: [FuzzShape; 6] = [
        FuzzShape::WarmSpike,
        FuzzShape::ColdSpike,
        FuzzShape::OnOff,
        FuzzShape::Ramp,
        FuzzShape::Day,
        FuzzShape::Steady,
    ];

    /// The shape's name.
    pub fn name(self) -> &'static str {
        match self {
            FuzzShape::WarmSpike => "warm-spike",
            FuzzShape::ColdSpike => "cold-spike",
            FuzzShape::OnOff => "on-off",
            FuzzShape::Ramp => "ramp",
            FuzzShape::Day => "day",
            FuzzShape::Steady => "steady",
        }
    }
}

/// One generated case: the traffic and the workers.
#[derive(Clone, Debug)]
pub struct Case {
    /// The seed it was drawn from.
    pub seed: u64,
    /// Its shape.
    pub shape: FuzzShape,
    /// What was drawn, in words.
    pub description: String,
    /// The simulation (without policies).
    pub config: SimConfig,
}

/// How long a generated trace lasts at most, in seconds: long enough for a spike, its
/// drain and every scale-down window, short enough that hundreds run in seconds.
const LENGTH: f64 = 2400.0;

impl Case {
    /// The case of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f022);
        let shape = FuzzShape::ALL[rng.random_range(0..FuzzShape::ALL.len())];
        let mean = log_uniform(&mut rng, 0.1, 5.0);
        let job_duration = match rng.random_range(0..3) {
            0 => DurationDist::Const(mean),
            1 => DurationDist::Exp(mean),
            _ => {
                let sigma = rng.random_range(0.3..1.2f64);
                DurationDist::LogNormal {
                    median: mean / (sigma * sigma / 2.0).exp(),
                    sigma,
                }
            }
        };
        let concurrency = [1u32, 1, 2, 4, 8][rng.random_range(0..5)];
        let pod_startup = Duration::from_secs(rng.random_range(5..=60));
        // What one pod completes per second, to scale rates to a few pods' worth.
        let per_pod = f64::from(concurrency) / mean;
        let mut rows: Vec<(f64, u64)> = Vec::new();
        let minute = 60.0;
        let description;
        match shape {
            FuzzShape::WarmSpike | FuzzShape::ColdSpike => {
                let rate = if shape == FuzzShape::WarmSpike {
                    per_pod * log_uniform(&mut rng, 0.1, 3.0)
                } else if rng.random_bool(0.5) {
                    0.0
                } else {
                    log_uniform(&mut rng, 0.001, 0.05)
                };
                let spike = log_uniform(&mut rng, 20.0, 3000.0).round() as u64;
                let spike_seconds = rng.random_range(1..=10) as f64;
                let at = (rng.random_range(0.2..0.6f64) * LENGTH).round();
                let mut t = 0.0;
                while t < LENGTH {
                    if at >= t && at < t + minute {
                        rows.push((t, poisson(&mut rng, rate * (at - t))));
                        rows.push((at, spike + poisson(&mut rng, rate * spike_seconds)));
                        t = at + spike_seconds;
                        continue;
                    }
                    rows.push((t, poisson(&mut rng, rate * minute)));
                    t += minute;
                }
                description = format!(
                    "{rate:.3} jobs/s, a spike of {spike} jobs within {spike_seconds:.0} s at {at:.0} s"
                );
            }
            FuzzShape::OnOff => {
                let rate = per_pod * log_uniform(&mut rng, 0.5, 10.0);
                let on = rng.random_range(10..=300) as f64;
                let off = rng.random_range(30..=900) as f64;
                let mut t = 0.0;
                while t < LENGTH {
                    rows.push((t, poisson(&mut rng, rate * on)));
                    rows.push((t + on, 0));
                    t += on + off;
                }
                description = format!("{rate:.2} jobs/s for {on:.0} s, then {off:.0} s of nothing");
            }
            FuzzShape::Ramp => {
                let from = per_pod * log_uniform(&mut rng, 0.05, 5.0);
                let to = per_pod * log_uniform(&mut rng, 0.05, 5.0);
                let mut t = 0.0;
                while t < LENGTH {
                    let rate = from + (to - from) * t / LENGTH;
                    rows.push((t, poisson(&mut rng, rate * minute)));
                    t += minute;
                }
                description = format!("from {from:.2} to {to:.2} jobs/s");
            }
            FuzzShape::Day => {
                let low = per_pod * log_uniform(&mut rng, 0.01, 0.5);
                let high = per_pod * log_uniform(&mut rng, 1.0, 8.0);
                let noise = rng.random_range(0.0..0.5f64);
                let mut t = 0.0;
                while t < LENGTH {
                    let phase = (std::f64::consts::PI * t / LENGTH).sin().powi(2);
                    let wobble = 1.0 + noise * (2.0 * rng.random::<f64>() - 1.0);
                    let rate = (low + (high - low) * phase) * wobble;
                    rows.push((t, poisson(&mut rng, rate.max(0.0) * minute)));
                    t += minute;
                }
                description = format!(
                    "a day of {:.0} s between {low:.2} and {high:.2} jobs/s, noise ±{:.0} %",
                    LENGTH,
                    noise * 100.0
                );
            }
            FuzzShape::Steady => {
                let rate = per_pod * log_uniform(&mut rng, 0.05, 8.0);
                let mut t = 0.0;
                while t < LENGTH {
                    rows.push((t, poisson(&mut rng, rate * minute)));
                    t += minute;
                }
                description = format!("{rate:.2} jobs/s");
            }
        }
        rows.retain(|&(t, _)| t < LENGTH);
        rows.push((LENGTH, 0));
        // A quarter of the cases call something limited, below the peak they would reach.
        let rate_limit = rng
            .random_bool(0.25)
            .then(|| {
                let per_second = (per_pod * log_uniform(&mut rng, 0.5, 4.0)).max(0.2);
                // Whole jobs per minute: 30/1m, 300/1m ...
                let per_minute = (per_second * 60.0).round().max(1.0) as u32;
                format!("{per_minute}/1m").parse::<RateLimit>().ok()
            })
            .flatten();
        let downstream = downstream(seed, concurrency, rate_limit.is_some());
        let description = format!(
            "{}: {description}; jobs {}, {} at once per pod, pods ready after {} s{}{}",
            shape.name(),
            describe(job_duration),
            concurrency,
            pod_startup.as_secs(),
            rate_limit.map_or(String::new(), |l| format!(", rate limit {l}")),
            downstream.capacity.map_or(String::new(), |c| format!(
                ", a downstream serving {c} jobs at once"
            )),
        );
        let trace = Trace::new(rows)
            .unwrap_or_else(|_| unreachable!("rows are generated in time order from zero"));
        Case {
            seed,
            shape,
            description,
            config: SimConfig {
                trace,
                policies: Vec::new(),
                pod_startup,
                job_duration,
                concurrency,
                seed,
                rate_limit,
                downstream,
            },
        }
    }
}

/// A fifth of the cases without a rate limit run their jobs through a downstream they
/// share (a database's connection pool), which binds at a random pool size: its
/// capacity is the slots of 1 to 30 pods (log-uniform), so it binds below the peak of
/// most cases that grow and above that of others. A rate-limited queue gets none: the
/// engine turns the knee off there (the limit flattens completions the same way), so
/// such a case would measure nothing of it. Drawn from a generator of its own, so the
/// rest of a case is what the seed gave before downstreams were drawn.
fn downstream(seed: u64, concurrency: u32, rate_limited: bool) -> crate::simulate::Downstream {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xd0_5735_ea3d);
    if !rng.random_bool(0.2) || rate_limited {
        return crate::simulate::Downstream::default();
    }
    let pods = log_uniform(&mut rng, 1.0, 30.0);
    let capacity = (pods * f64::from(concurrency)).round().max(1.0);
    crate::simulate::Downstream {
        capacity: Some(capacity as u32),
        rate: None,
    }
}

/// One case's outcome against every KEDA setting.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The case's seed.
    pub seed: u64,
    /// Its shape.
    pub shape: FuzzShape,
    /// What was drawn.
    pub description: String,
    /// The engine and every KEDA setting.
    pub comparison: Comparison,
}

impl Outcome {
    /// Runs the case with the engine's `spec` against every KEDA setting.
    pub fn run(case: &Case, spec: &ScalingSpec) -> Self {
        Outcome {
            seed: case.seed,
            shape: case.shape,
            description: case.description.clone(),
            comparison: Comparison::run(&case.config, spec),
        }
    }

    /// The KEDA setting that comes closest to beating the engine, and by how much: the
    /// engine's replica-seconds over that setting's, among the settings that wait as
    /// little ([`super::compare::waits_as_little`]; above [`super::compare::COST_SHARE`]'s
    /// inverse, the setting beats the engine). `None` when no setting waits as little.
    pub fn closest(&self) -> Option<(&super::compare::KedaRow, f64)> {
        let engine = &self.comparison.engine;
        self.comparison
            .keda
            .iter()
            .filter(|row| super::compare::waits_as_little(&row.report, engine))
            .map(|row| {
                let ratio = if row.report.replica_seconds > 0.0 {
                    engine.replica_seconds / row.report.replica_seconds
                } else if engine.replica_seconds > 0.0 {
                    f64::INFINITY
                } else {
                    1.0
                };
                (row, ratio)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// One line: the seed, the verdict, the engine's figures and the closest KEDA setting.
    pub fn line(&self) -> String {
        let e = &self.comparison.engine;
        let verdict = if self.comparison.beaten_by().is_empty() {
            "ok    "
        } else {
            "BEATEN"
        };
        let closest = match self.closest() {
            Some((row, ratio)) => format!(
                "closest: keda {} p95 {:.2}s p99 {:.2}s {:.0} rs (engine costs {:.2}x)",
                row.setting,
                row.report.p95_wait_s,
                row.report.p99_wait_s,
                row.report.replica_seconds,
                ratio
            ),
            None => "every KEDA setting waits longer".into(),
        };
        format!(
            "seed {:<6} {verdict} engine p95 {:.2}s p99 {:.2}s {:.0} rs, utilization {:.0} %; {closest}\n             {}",
            self.seed,
            e.p95_wait_s,
            e.p99_wait_s,
            e.replica_seconds,
            100.0 * e.utilization,
            self.description
        )
    }
}

/// A number between `low` and `high` whose logarithm is uniform: as many small values as
/// large ones.
fn log_uniform(rng: &mut StdRng, low: f64, high: f64) -> f64 {
    (low.ln() + rng.random::<f64>() * (high.ln() - low.ln())).exp()
}

fn poisson(rng: &mut StdRng, mean: f64) -> u64 {
    super::trace::poisson(rng, mean)
}

fn describe(d: DurationDist) -> String {
    match d {
        DurationDist::Const(s) => format!("const {s:.2} s"),
        DurationDist::Exp(s) => format!("exp, mean {s:.2} s"),
        DurationDist::LogNormal { median, sigma } => {
            format!("lognormal, median {median:.2} s, sigma {sigma:.2}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::PolicyReport;
    use crate::simulate::compare::{Comparison, KedaRow, beats};

    #[test]
    fn a_seed_always_gives_the_same_case_and_seeds_cover_every_shape() {
        let a = Case::new(42);
        let b = Case::new(42);
        assert_eq!(a.description, b.description);
        assert_eq!(a.config.trace, b.config.trace);
        let mut shapes: Vec<FuzzShape> = (0..200).map(|s| Case::new(s).shape).collect();
        shapes.sort_by_key(|s| s.name());
        shapes.dedup();
        assert_eq!(shapes.len(), FuzzShape::ALL.len(), "{shapes:?}");
        let limited = (0..200)
            .filter(|&s| Case::new(s).config.rate_limit.is_some())
            .count();
        assert!(
            (20..100).contains(&limited),
            "{limited} of 200 rate-limited"
        );
        let shared = (0..200)
            .filter(|&s| Case::new(s).config.downstream.is_set())
            .count();
        assert!(
            (20..80).contains(&shared),
            "{shared} of 200 with a downstream"
        );
        let kinds: std::collections::BTreeSet<&str> = (0..200)
            .map(|s| match Case::new(s).config.job_duration {
                DurationDist::Const(_) => "const",
                DurationDist::Exp(_) => "exp",
                DurationDist::LogNormal { .. } => "lognormal",
            })
            .collect();
        assert_eq!(kinds.len(), 3);
    }

    #[test]
    fn a_setting_wins_only_cheaper_by_the_margin_and_as_quick_at_both_p95_and_p99() {
        let report = PolicyReport::waits;
        let row = |report: PolicyReport, engine: &PolicyReport| KedaRow {
            setting: "s".into(),
            min_replicas: 0,
            cooldown_seconds: 30,
            scale_down_window_seconds: 30,
            beats_engine: beats(&report, engine),
            report,
        };
        let engine = report(5.0, 6.0, 1000.0);
        let outcome = |keda: Vec<KedaRow>| Outcome {
            seed: 0,
            shape: FuzzShape::ColdSpike,
            description: String::new(),
            comparison: Comparison {
                engine: engine.clone(),
                keda,
            },
        };
        // Cheaper, as quick at p95, far slower at p99: no win, and not the closest.
        let slow_tail = outcome(vec![row(report(5.0, 40.0, 800.0), &engine)]);
        assert!(slow_tail.comparison.beaten_by().is_empty());
        assert!(slow_tail.closest().is_none());
        // Within 1 s at both, at 85 % of the cost: beaten.
        let both = outcome(vec![
            row(report(5.0, 40.0, 800.0), &engine),
            row(report(5.9, 6.9, 850.0), &engine),
        ]);
        assert_eq!(both.comparison.beaten_by().len(), 1);
        // As quick at both, at 95 % of the cost: not cheaper by the margin.
        let dear = outcome(vec![row(report(5.0, 6.0, 950.0), &engine)]);
        assert!(dear.comparison.beaten_by().is_empty());
        assert!(dear.closest().is_some());
    }

    #[test]
    fn every_case_lasts_the_same_and_carries_jobs() {
        for seed in 0..50 {
            let case = Case::new(seed);
            assert_eq!(case.config.trace.end(), LENGTH, "seed {seed}");
            if case.shape != FuzzShape::ColdSpike {
                assert!(
                    case.config.trace.jobs() > 0,
                    "seed {seed}: {}",
                    case.description
                );
            }
        }
    }
}
