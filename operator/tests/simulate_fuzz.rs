//! The engine, with its defaults, against every KEDA setting `simulate --compare-keda`
//! knows, on 200 random cases that no one picked: `simulate --fuzz 200 --seed 0` (lone
//! spikes on warm and cold pools, on/off bursts, ramps, noisy days and steady traffic;
//! constant, exponential and lognormal jobs; random concurrency, start-up times and rate
//! limits). A case is beaten when a KEDA setting waits within 1 s of the engine's at both
//! the p95 and the p99 at no more than 90 % of its replica-seconds.
//!
//! The goal is no case beaten, and none is. Two were, both a pool woken by a lone spike
//! on a queue that had no jobs before, while the engine kept its last pod 300 s after
//! the spike; left out, `idleSecondsBeforeZero` is now learned (one start-up until work
//! is seen to come back within 300 s). A case beaten fails this test, naming the seed to
//! replay (`workerpool-operator simulate --fuzz 1 --seed S`); `KNOWN` lists the cases
//! allowed to be beaten, with why, and a listed case that is no longer beaten fails it
//! too, so the list only shrinks.
//!
//! The simulation runs in virtual time: the figures are the same on every machine.

use workerpool_operator::scaling::ScalingSpec;
use workerpool_operator::simulate::fuzz::{Case, Outcome};

/// Seeds beaten today, each with its reason (see the module's text).
const KNOWN: [(u64, &str); 0] = [];

const SEEDS: std::ops::Range<u64> = 0..200;

#[test]
fn with_its_defaults_the_engine_is_beaten_by_no_keda_setting_on_random_traffic_but_the_known_cases()
{
    let spec = ScalingSpec::default();
    let mut beaten = Vec::new();
    let mut lines = Vec::new();
    for seed in SEEDS {
        let outcome = Outcome::run(&Case::new(seed), &spec);
        assert!(
            outcome
                .comparison
                .keda
                .iter()
                .all(|row| row.report.jobs == outcome.comparison.engine.jobs),
            "seed {seed}: every policy runs every job"
        );
        if !outcome.comparison.beaten_by().is_empty() {
            beaten.push(seed);
            lines.push(outcome.line());
        }
    }
    let known: Vec<u64> = KNOWN.iter().map(|(seed, _)| *seed).collect();
    let new: Vec<u64> = beaten
        .iter()
        .copied()
        .filter(|s| !known.contains(s))
        .collect();
    assert!(
        new.is_empty(),
        "beaten on seeds {new:?} (replay with simulate --fuzz 1 --seed S):\n{}",
        lines.join("\n")
    );
    let mended: Vec<u64> = known
        .iter()
        .copied()
        .filter(|s| !beaten.contains(s))
        .collect();
    assert!(
        mended.is_empty(),
        "seeds {mended:?} are no longer beaten: take them off KNOWN"
    );
}
