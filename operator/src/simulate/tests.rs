use std::time::Duration;

use super::*;

fn config(trace: &str, policies: Vec<Policy>) -> SimConfig {
    SimConfig {
        trace: Trace::parse_csv(trace).expect("valid trace"),
        policies,
        pod_startup: Duration::from_secs(10),
        job_duration: DurationDist::Const(1.0),
        concurrency: 1,
        seed: 1,
        rate_limit: None,
    }
}

fn both() -> Vec<Policy> {
    vec![
        Policy::Engine(Box::default()),
        Policy::Keda(KedaSettings::defaults(5, 100)),
    ]
}

#[test]
fn every_job_is_processed_by_every_policy() {
    let report = run(&config("0,500\n10,0\n600,0\n", both()));
    assert_eq!(report.policies.len(), 2);
    for (name, policy) in &report.policies {
        assert_eq!(policy.jobs, 500, "{name}");
        assert!(
            policy.max_backlog > 0 && policy.max_backlog <= 500,
            "{name}: {policy:?}"
        );
        assert!(policy.scale_events >= 2, "{name}: {policy:?}");
    }
}

#[test]
fn a_run_is_deterministic_for_a_seed() {
    let mut c = config("0,300\n60,20\n120,0\n900,0\n", both());
    c.job_duration = DurationDist::Exp(2.0);
    assert_eq!(run(&c), run(&c));
}

#[test]
fn a_single_job_waits_for_the_poll_and_the_pod_start() {
    // One job at t = 0.5: the engine sees it at its next 5 s poll, the pod is ready 10 s
    // later, so the job waits 4.5 + 10 s. KEDA polls every 30 s: 29.5 + 10 s.
    let report = run(&config("0.5,1\n0.5,0\n1000,0\n", both()));
    assert_eq!(report.policies["engine"].p50_wait_s, 14.5);
    assert_eq!(report.policies["keda"].p50_wait_s, 39.5);
    // The engine's pod lives from 5 s: ready at 15 s, its job done by the poll at 20 s
    // (a completion, so work), idle from the poll at 25 s, and with no earlier idle spell
    // kept one measured start-up (10 s) more: gone at 35 s. KEDA's lives from 30 s until
    // the first poll 300 s after the last one that saw a job.
    assert_eq!(report.policies["engine"].replica_seconds, 30.0);
    assert_eq!(report.policies["keda"].replica_seconds, 300.0);
}

#[test]
fn the_engine_waits_less_than_keda_on_a_burst() {
    let report = run(&config("0,2000\n10,0\n3600,0\n", both()));
    let (engine, keda) = (&report.policies["engine"], &report.policies["keda"]);
    assert!(
        engine.p95_wait_s < keda.p95_wait_s,
        "{engine:?} vs {keda:?}"
    );
}

#[test]
fn json_report_is_keyed_by_policy_with_the_documented_fields() {
    let report = run(&config("0,10\n1,0\n100,0\n", both()));
    let json = serde_json::to_value(&report).expect("serializes");
    for policy in ["engine", "keda"] {
        for field in [
            "p50_wait_s",
            "p95_wait_s",
            "p99_wait_s",
            "max_backlog",
            "replica_seconds",
            "scale_events",
            "jobs",
        ] {
            assert!(
                json[policy][field].is_number(),
                "{policy}.{field} in {json}"
            );
        }
    }
}

#[test]
fn a_rate_limit_starts_jobs_no_faster_than_it_allows_however_many_pods_run() {
    // 200 jobs at once, 10 jobs/s allowed, a burst of 1: the last starts 19.9 s after
    // the first, whatever the pool's size.
    let mut c = config("0,200\n0.01,0\n600,0\n", both());
    c.rate_limit = Some("10/s".parse().expect("limit"));
    let report = run(&c);
    for (name, policy) in &report.policies {
        assert_eq!(policy.jobs, 200, "{name}");
        assert!(policy.p99_wait_s >= 19.0, "{name}: {policy:?}");
    }
    let unlimited = run(&config("0,200\n0.01,0\n600,0\n", both()));
    assert!(unlimited.policies["keda"].p99_wait_s < report.policies["keda"].p99_wait_s);
}
