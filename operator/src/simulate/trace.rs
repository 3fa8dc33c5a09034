//! Arrival traces: CSV files of `t_seconds,jobs` rows, and generators for common shapes.

use std::f64::consts::PI;
use std::fmt::Write as _;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::SimError;

const DAY: f64 = 86_400.0;

/// Jobs arriving over time. Row `i`'s jobs arrive spread at random over `[t_i, t_{i+1})`;
/// the last row's over one second. The trace ends at its last row.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    rows: Vec<(f64, u64)>,
}

impl Trace {
    /// A trace from `(t_seconds, jobs)` rows in time order.
    pub fn new(rows: Vec<(f64, u64)>) -> Result<Self, SimError> {
        for (i, pair) in rows.windows(2).enumerate() {
            if pair[1].0 < pair[0].0 {
                return Err(SimError::Trace {
                    line: i + 2,
                    reason: "times must not decrease".into(),
                });
            }
        }
        if let Some(&(t, _)) = rows.first()
            && (!t.is_finite() || t < 0.0)
        {
            return Err(SimError::Trace {
                line: 1,
                reason: "times must be finite and non-negative".into(),
            });
        }
        Ok(Trace { rows })
    }

    /// Parses CSV text: one `t_seconds,jobs` row per line; blank lines, `#` comments and a
    /// header line are skipped.
    pub fn parse_csv(text: &str) -> Result<Self, SimError> {
        let mut rows: Vec<(f64, u64)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty()
                || line.starts_with('#')
                || (rows.is_empty() && line.starts_with('t'))
            {
                continue;
            }
            let error = |reason: String| SimError::Trace {
                line: index + 1,
                reason,
            };
            let (t, jobs) = line
                .split_once(',')
                .ok_or_else(|| error("expected `t_seconds,jobs`".into()))?;
            let t: f64 = t
                .trim()
                .parse()
                .map_err(|e| error(format!("bad time {t:?}: {e}")))?;
            let jobs: u64 = jobs
                .trim()
                .parse()
                .map_err(|e| error(format!("bad job count {jobs:?}: {e}")))?;
            if !t.is_finite() || t < 0.0 {
                return Err(error(format!("time {t} must be finite and non-negative")));
            }
            if rows.last().is_some_and(|&(last, _)| t < last) {
                return Err(error(format!("time {t} is before the previous row's")));
            }
            rows.push((t, jobs));
        }
        Ok(Trace { rows })
    }

    /// The CSV form, with a header.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("t_seconds,jobs\n");
        for (t, jobs) in &self.rows {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{t},{jobs}");
        }
        out
    }

    /// When the trace ends (its last row's time).
    pub fn end(&self) -> f64 {
        self.rows.last().map_or(0.0, |&(t, _)| t)
    }

    /// The arrival rate when the trace is steady traffic (every row's rate
    /// within a quarter of the mean, as Poisson noise on a constant rate
    /// gives), in jobs a second.
    pub fn steady_rate(&self) -> Option<f64> {
        let rates: Vec<f64> = self
            .rows
            .windows(2)
            .filter(|w| w[1].0 > w[0].0)
            .map(|w| w[0].1 as f64 / (w[1].0 - w[0].0))
            .collect();
        if rates.len() < 10 {
            return None;
        }
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        (mean > 0.0 && rates.iter().all(|r| (r - mean).abs() <= 0.25 * mean)).then_some(mean)
    }

    /// Total jobs.
    pub fn jobs(&self) -> u64 {
        self.rows.iter().map(|&(_, n)| n).sum()
    }

    /// Arrival times in order, drawn with `seed`.
    pub fn arrival_times(&self, seed: u64) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut times = Vec::with_capacity(usize::try_from(self.jobs()).unwrap_or(0));
        for (i, &(t, jobs)) in self.rows.iter().enumerate() {
            let span = self.rows.get(i + 1).map_or(1.0, |&(next, _)| next - t);
            let start = times.len();
            times.extend((0..jobs).map(|_| t + rng.random::<f64>() * span));
            times[start..].sort_by(f64::total_cmp);
        }
        times
    }

    /// A day of traffic of the given shape.
    pub fn generate(shape: Shape, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut rows = Vec::new();
        let minute = 60.0;
        match shape {
            Shape::Steady => {
                for m in 0..1440 {
                    rows.push((f64::from(m) * minute, poisson(&mut rng, 4.0 * minute)));
                }
            }
            Shape::Diurnal => {
                for m in 0..1440 {
                    let t = f64::from(m) * minute;
                    // Quiet at night, peaking at 8 jobs/s in the afternoon.
                    let rate = 0.2 + 8.0 * (PI * (t - 3.0 * 3600.0) / DAY).sin().powi(2);
                    rows.push((t, poisson(&mut rng, rate * minute)));
                }
            }
            Shape::Burst => {
                // A cron fan-out: 1,500 jobs within 10 s at the top of every hour, a trickle
                // in between.
                for h in 0..24 {
                    let t = f64::from(h) * 3600.0;
                    rows.push((t, 1500));
                    for m in 0..59 {
                        rows.push((
                            t + 10.0 + f64::from(m) * minute,
                            poisson(&mut rng, 0.05 * minute),
                        ));
                    }
                }
            }
            Shape::Spikes => {
                // 1 job/s of background with spikes of 200 to 3,000 jobs over 5 to 60 s,
                // every 45 minutes on average.
                let mut next_spike = exponential(&mut rng, 2700.0);
                let mut t = 0.0;
                while t < DAY {
                    if next_spike < t + minute {
                        let start = next_spike.max(t);
                        rows.push((t, poisson(&mut rng, (start - t).max(0.0))));
                        let length = rng.random_range(5.0..60.0f64).round();
                        rows.push((start, rng.random_range(200..=3000u64)));
                        t = start + length;
                        next_spike = t + exponential(&mut rng, 2700.0);
                        continue;
                    }
                    rows.push((t, poisson(&mut rng, minute)));
                    t += minute;
                }
            }
            Shape::ShortSpikes => {
                // Many short spikes over a near-idle queue: 10 to 150 jobs within 1 to 10 s,
                // every 6 minutes on average, with 0.02 jobs/s in between.
                let mut next_spike = exponential(&mut rng, 360.0);
                let mut t = 0.0;
                while t < DAY {
                    if next_spike < t + minute {
                        let start = next_spike.max(t);
                        rows.push((t, poisson(&mut rng, 0.02 * (start - t).max(0.0))));
                        let length = rng.random_range(1.0..10.0f64).round();
                        rows.push((start, rng.random_range(10..=150u64)));
                        t = start + length;
                        next_spike = t + exponential(&mut rng, 360.0);
                        continue;
                    }
                    rows.push((t, poisson(&mut rng, 0.02 * minute)));
                    t += minute;
                }
            }
            Shape::Ramp => {
                // A slow ramp: from 0.1 jobs/s at midnight up to 8 jobs/s at 20:00, then
                // back down to 0.1 jobs/s by the end of the day.
                let peak = 20.0 * 3600.0;
                for m in 0..1440 {
                    let t = f64::from(m) * minute;
                    let share = if t < peak {
                        t / peak
                    } else {
                        (DAY - t) / (DAY - peak)
                    };
                    rows.push((t, poisson(&mut rng, (0.1 + 7.9 * share) * minute)));
                }
            }
            Shape::Sparse => {
                // A webhook-style queue: bursts of 1 to 50 jobs about once an hour.
                let mut t = exponential(&mut rng, 3600.0);
                rows.push((0.0, 0));
                while t < DAY {
                    rows.push((t.round(), rng.random_range(1..=50u64)));
                    rows.push((t.round() + 1.0, 0));
                    t += exponential(&mut rng, 3600.0);
                }
            }
        }
        rows.push((DAY, 0));
        Trace { rows }
    }
}

/// The shapes `--generate` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// 4 jobs/s all day.
    Steady,
    /// 1,500 jobs at the top of every hour, a trickle in between.
    Burst,
    /// A day/night curve between 0.2 and 8.2 jobs/s.
    Diurnal,
    /// 1 job/s with random spikes of 200 to 3,000 jobs.
    Spikes,
    /// A few jobs about once an hour.
    Sparse,
    /// 10 to 150 jobs within seconds, every 6 minutes on average.
    ShortSpikes,
    /// From 0.1 up to 8 jobs/s over 20 hours, then back down.
    Ramp,
}

impl Shape {
    /// The name `--generate` takes.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Steady => "steady",
            Shape::Burst => "burst",
            Shape::Diurnal => "diurnal",
            Shape::Spikes => "spikes",
            Shape::Sparse => "sparse",
            Shape::ShortSpikes => "short-spikes",
            Shape::Ramp => "ramp",
        }
    }
}

impl FromStr for Shape {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "steady" => Shape::Steady,
            "burst" => Shape::Burst,
            "diurnal" => Shape::Diurnal,
            "spikes" => Shape::Spikes,
            "sparse" => Shape::Sparse,
            "short-spikes" => Shape::ShortSpikes,
            "ramp" => Shape::Ramp,
            other => {
                return Err(SimError::Argument(format!(
                    "unknown trace shape {other:?}; expected steady, burst, diurnal, spikes, sparse, short-spikes or ramp"
                )));
            }
        })
    }
}

fn exponential(rng: &mut StdRng, mean: f64) -> f64 {
    -mean * (1.0 - rng.random::<f64>()).ln()
}

/// Box-Muller: one standard normal sample.
pub(super) fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
}

pub(super) fn poisson(rng: &mut StdRng, mean: f64) -> u64 {
    if mean <= 0.0 {
        return 0;
    }
    if mean > 30.0 {
        return (mean + mean.sqrt() * standard_normal(rng)).round().max(0.0) as u64;
    }
    let limit = (-mean).exp();
    let mut product = rng.random::<f64>();
    let mut count = 0;
    while product > limit {
        product *= rng.random::<f64>();
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rows_skipping_header_comments_and_blanks() {
        let trace = Trace::parse_csv("t_seconds,jobs\n# quiet start\n0,5\n\n10, 20\n60,0\n")
            .expect("valid");
        assert_eq!(
            trace,
            Trace {
                rows: vec![(0.0, 5), (10.0, 20), (60.0, 0)]
            }
        );
        assert_eq!((trace.end(), trace.jobs()), (60.0, 25));
    }

    #[test]
    fn refuses_rows_out_of_order_with_the_line_number() {
        let error = Trace::parse_csv("0,1\n10,1\n5,1\n").expect_err("out of order");
        assert!(error.to_string().contains("line 3"), "{error}");
        assert!(Trace::parse_csv("0;1\n").is_err());
        assert!(
            Trace::parse_csv("time,jobs\n0,1\n").is_ok(),
            "a header starts with t"
        );
        assert!(Trace::parse_csv("x,1\n0,1\n").is_err());
    }

    #[test]
    fn spreads_each_rows_jobs_until_the_next_row() {
        let trace = Trace::parse_csv("0,100\n10,0\n").expect("valid");
        let times = trace.arrival_times(7);
        assert_eq!(times.len(), 100);
        assert!(times.iter().all(|t| (0.0..10.0).contains(t)));
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(times, trace.arrival_times(7), "deterministic for a seed");
    }

    #[test]
    fn generated_days_have_the_advertised_volume() {
        let steady = Trace::generate(Shape::Steady, 1);
        assert_eq!(steady.end(), DAY);
        let per_second = steady.jobs() as f64 / DAY;
        assert!((3.9..4.1).contains(&per_second), "{per_second}");
        let burst = Trace::generate(Shape::Burst, 1);
        assert!(burst.jobs() >= 24 * 1500);
        assert_eq!(
            Trace::generate(Shape::Spikes, 3),
            Trace::generate(Shape::Spikes, 3)
        );
        let csv = Trace::generate(Shape::Sparse, 2).to_csv();
        assert_eq!(
            Trace::parse_csv(&csv).expect("round trip"),
            Trace::generate(Shape::Sparse, 2)
        );
    }
}
