//! The claim docs/scaling.md makes, on the shipped traces that simulate quickly: with the
//! defaults, the engine waits less than the KEDA baseline at no more replica-seconds.

use std::time::Duration;

use workerpool_operator::simulate::{DurationDist, KedaSettings, Policy, SimConfig, Trace, run};

fn compare(csv: &str) {
    let config = SimConfig {
        trace: Trace::parse_csv(csv).expect("shipped traces parse"),
        policies: vec![
            Policy::Engine(Box::default()),
            Policy::Keda(KedaSettings::defaults(5, 100)),
        ],
        pod_startup: Duration::from_secs(15),
        job_duration: DurationDist::Exp(1.0),
        concurrency: 1,
        seed: 1,
    };
    let report = run(&config);
    let (engine, keda) = (&report.policies["engine"], &report.policies["keda"]);
    assert_eq!(engine.jobs, keda.jobs);
    assert!(
        engine.p95_wait_s < keda.p95_wait_s,
        "{engine:?} vs {keda:?}"
    );
    assert!(
        engine.replica_seconds <= keda.replica_seconds,
        "{engine:?} vs {keda:?}"
    );
}

#[test]
fn the_engine_beats_keda_on_the_burst_trace() {
    compare(include_str!("../traces/burst.csv"));
}

#[test]
fn the_engine_beats_keda_on_the_sparse_trace() {
    compare(include_str!("../traces/sparse.csv"));
}
