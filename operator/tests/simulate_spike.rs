//! The spike goal of docs/scaling.md on a warm pool: a short spike on steady
//! traffic costs the engine at most half the replica-seconds it costs KEDA
//! with `minReplicaCount: 1` (its most common setting), over the same day
//! without the spike. Steady 4.2 jobs/s that one pod of four 500 ms slots
//! carries, a spike of N jobs in one second in the middle of two hours, pods
//! ready 20 s after creation; several spike sizes and seeds.
//!
//! The p99 half of that goal is not held here: for spikes of 100 to 300 jobs
//! the engine's p99 wait is 0.1 to 2.6 s above KEDA's. That p99 is the wait of
//! the spike's jobs served before any new pod is ready, by the pods already
//! warm, and KEDA `min 1` runs 1.43 to 1.47 pods on this day where the engine runs one
//! (see "A lone spike on a warm pool" in docs/scaling.md).

use std::time::Duration;

use workerpool_operator::scaling::ScalingSpec;
use workerpool_operator::simulate::compare::Comparison;
use workerpool_operator::simulate::{DurationDist, SimConfig, Trace};

/// Two hours of 252 jobs a minute, and `spike` more jobs in the second
/// after the first hour.
fn day(spike: u64) -> Trace {
    let mut rows = Vec::new();
    for minute in 0..120u32 {
        let t = f64::from(minute * 60);
        if minute == 60 && spike > 0 {
            rows.push((t, spike + 4));
            rows.push((t + 1.0, 248));
        } else {
            rows.push((t, 252));
        }
    }
    rows.push((7200.0, 0));
    Trace::new(rows).expect("a trace")
}

/// The engine's and KEDA `min 1`'s replica-seconds on the day with `spike`.
fn costs(spike: u64, seed: u64) -> (f64, f64) {
    let config = SimConfig {
        trace: day(spike),
        policies: Vec::new(),
        pod_startup: Duration::from_secs(20),
        job_duration: "exp:500ms".parse::<DurationDist>().expect("a distribution"),
        concurrency: 4,
        seed,
        rate_limit: None,
        downstream: workerpool_operator::simulate::Downstream::default(),
    };
    let comparison = Comparison::run(&config, &ScalingSpec::default());
    let keda = comparison
        .keda
        .iter()
        .find(|row| row.setting == "min 1")
        .expect("the min 1 setting");
    (
        comparison.engine.replica_seconds,
        keda.report.replica_seconds,
    )
}

#[test]
fn a_spike_on_a_warm_pool_costs_at_most_half_of_what_it_costs_keda_with_one_warm_pod() {
    let mut misses = Vec::new();
    for seed in [7, 8] {
        let (engine_base, keda_base) = costs(0, seed);
        for spike in [300, 1500] {
            let (engine, keda) = costs(spike, seed);
            let (engine_extra, keda_extra) = (engine - engine_base, keda - keda_base);
            if engine_extra > keda_extra / 2.0 {
                misses.push(format!(
                    "seed {seed}, {spike} jobs: the engine spent {engine_extra:.0} replica-seconds more, KEDA min 1 {keda_extra:.0}"
                ));
            }
        }
    }
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}
