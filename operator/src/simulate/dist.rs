//! Job duration distributions: `const:200ms`, `exp:1s`, `lognormal:1s,0.5`.

use std::str::FromStr;

use rand::Rng;
use rand::rngs::StdRng;

use super::SimError;
use super::trace::standard_normal;

/// How long jobs take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DurationDist {
    /// Every job takes this many seconds.
    Const(f64),
    /// Exponentially distributed with this mean, in seconds.
    Exp(f64),
    /// Log-normal with this median in seconds and this sigma (of the underlying normal).
    LogNormal { median: f64, sigma: f64 },
}

impl DurationDist {
    /// Draws one duration in seconds.
    pub fn sample(&self, rng: &mut StdRng) -> f64 {
        match *self {
            DurationDist::Const(seconds) => seconds,
            DurationDist::Exp(mean) => -mean * (1.0 - rng.random::<f64>()).ln(),
            DurationDist::LogNormal { median, sigma } => {
                median * (sigma * standard_normal(rng)).exp()
            }
        }
    }

    /// The mean duration in seconds.
    pub fn mean(&self) -> f64 {
        match *self {
            DurationDist::Const(seconds) | DurationDist::Exp(seconds) => seconds,
            DurationDist::LogNormal { median, sigma } => median * (sigma * sigma / 2.0).exp(),
        }
    }
}

impl FromStr for DurationDist {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            SimError::Argument(format!(
                "bad job duration {s:?}: {why}; expected const:DUR, exp:DUR or lognormal:DUR,SIGMA (e.g. exp:1s)"
            ))
        };
        let (kind, rest) = s.split_once(':').ok_or_else(|| bad("missing the kind"))?;
        let duration = |text: &str| -> Result<f64, SimError> {
            let seconds = humantime::parse_duration(text.trim())
                .map_err(|e| bad(&e.to_string()))?
                .as_secs_f64();
            if seconds > 0.0 {
                Ok(seconds)
            } else {
                Err(bad("a duration must be positive"))
            }
        };
        match kind {
            "const" => Ok(DurationDist::Const(duration(rest)?)),
            "exp" => Ok(DurationDist::Exp(duration(rest)?)),
            "lognormal" => {
                let (median, sigma) = rest
                    .split_once(',')
                    .ok_or_else(|| bad("lognormal needs DUR,SIGMA"))?;
                let sigma: f64 = sigma
                    .trim()
                    .parse()
                    .map_err(|_| bad("sigma is not a number"))?;
                if !(sigma.is_finite() && sigma >= 0.0) {
                    return Err(bad("sigma must be finite and non-negative"));
                }
                Ok(DurationDist::LogNormal {
                    median: duration(median)?,
                    sigma,
                })
            }
            _ => Err(bad("unknown kind")),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn parses_the_three_kinds_with_humantime_durations() {
        assert_eq!(
            "const:200ms".parse::<DurationDist>().ok(),
            Some(DurationDist::Const(0.2))
        );
        assert_eq!(
            "exp:1s".parse::<DurationDist>().ok(),
            Some(DurationDist::Exp(1.0))
        );
        assert_eq!(
            "lognormal:2s,0.5".parse::<DurationDist>().ok(),
            Some(DurationDist::LogNormal {
                median: 2.0,
                sigma: 0.5
            })
        );
        for bad in [
            "1s",
            "exp:",
            "exp:0s",
            "lognormal:1s",
            "lognormal:1s,x",
            "uniform:1s",
        ] {
            assert!(
                bad.parse::<DurationDist>().is_err(),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn samples_have_the_stated_mean() {
        let mut rng = StdRng::seed_from_u64(1);
        for dist in [
            DurationDist::Exp(1.0),
            DurationDist::LogNormal {
                median: 1.0,
                sigma: 0.5,
            },
        ] {
            let mean = (0..100_000).map(|_| dist.sample(&mut rng)).sum::<f64>() / 100_000.0;
            assert!((mean - dist.mean()).abs() < 0.02, "{dist:?}: {mean}");
        }
    }
}
