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
        downstream: crate::simulate::Downstream::default(),
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

/// `jobs` jobs at once, on a pool KEDA holds at `pods` (a backlog per replica of one),
/// each job `d` seconds alone; the p99 wait.
fn burst_on_pods(jobs: u64, pods: i32, d: f64, downstream: Downstream) -> f64 {
    let mut c = config(
        &format!("0,{jobs}\n1,0\n20000,0\n"),
        vec![Policy::Keda(KedaSettings::defaults(1, pods))],
    );
    c.job_duration = DurationDist::Const(d);
    c.downstream = downstream;
    let report = run(&c);
    let keda = &report.policies["keda"];
    assert_eq!(keda.jobs, jobs);
    keda.p99_wait_s
}

#[test]
fn a_downstream_bounds_completions_however_many_pods_run_and_no_downstream_changes_nothing() {
    use rand::Rng;
    let mut rng = StdRng::seed_from_u64(7);
    let jobs = 300u64;
    // Job k (0-based) starts once k - pods + 1 jobs are done; done ones come at most
    // `rate` a second once pods are ready (at least 10 s in): its wait is at least the
    // low bound. At most: as long as without the downstream (the same pods, as soon),
    // and the time the downstream takes to serve every job before it.
    let k = (0.99 * jobs as f64).ceil() - 1.0;
    let bounds = |pods: i32, rate: f64, d: f64| {
        let low = 10.0 + ((k - f64::from(pods) + 1.0) / rate).max(0.0);
        let high = burst_on_pods(jobs, pods, d, Downstream::default()) + (k + 1.0) / rate + d;
        (low, high)
    };
    for _ in 0..25 {
        let pods = rng.random_range(1..=30);
        let d = rng.random_range(0.2..3.0f64);
        let capacity = rng.random_range(1..=12u32);
        let per_s = rng.random_range(0.5..20.0f64);
        let p = f64::from(pods);
        let shared = burst_on_pods(
            jobs,
            pods,
            d,
            Downstream {
                capacity: Some(capacity),
                rate: None,
            },
        );
        let (low, high) = bounds(pods, p.min(f64::from(capacity)) / d, d);
        assert!(
            (low - 1e-6..=high).contains(&shared),
            "capacity {capacity}, {pods} pods, {d:.2} s jobs: p99 wait {shared} not in {low:.1}..{high:.1}"
        );
        let limited = burst_on_pods(
            jobs,
            pods,
            d,
            Downstream {
                capacity: None,
                rate: Some(per_s),
            },
        );
        let (low, high) = bounds(pods, per_s.min(p / d), d);
        assert!(
            (low - 1e-6..=high).contains(&limited),
            "{per_s:.2}/s, {pods} pods, {d:.2} s jobs: p99 wait {limited} not in {low:.1}..{high:.1}"
        );
        // A capacity no pool reaches changes nothing.
        let roomy = burst_on_pods(
            jobs,
            pods,
            d,
            Downstream {
                capacity: Some(1000),
                rate: None,
            },
        );
        assert_eq!(roomy, burst_on_pods(jobs, pods, d, Downstream::default()));
    }
}

#[test]
fn jobs_sharing_a_saturated_downstream_run_at_its_share_of_their_speed() {
    // 20 warm pods (KEDA's minReplicaCount), then 40 one-second jobs at once on a
    // downstream of 4: the first 20 run together at a fifth of their speed, 5 s,
    // and the next 20 wait for them; alone, they would wait 1 s.
    let warm = KedaSettings {
        min_replicas: 20,
        ..KedaSettings::defaults(1000, 20)
    };
    let mut c = config("60,40\n60.001,0\n600,0\n", vec![Policy::Keda(warm)]);
    c.downstream = Downstream {
        capacity: Some(4),
        rate: None,
    };
    let shared = run(&c).policies["keda"].clone();
    assert_eq!(shared.jobs, 40);
    assert_eq!(shared.p50_wait_s, 0.0, "{shared:?}");
    assert!((4.99..=5.01).contains(&shared.p99_wait_s), "{shared:?}");
    c.downstream = Downstream::default();
    let alone = run(&c).policies["keda"].clone();
    assert_eq!(alone.p50_wait_s, 0.0, "{alone:?}");
    assert!((0.99..=1.01).contains(&alone.p99_wait_s), "{alone:?}");
    // The same pods for as long, their slots busy about five times as long (the
    // share is rounded to a thousandth).
    assert_eq!(shared.replica_seconds, alone.replica_seconds);
    assert!(
        shared.utilization >= 4.0 * alone.utilization,
        "{shared:?} {alone:?}"
    );
}
